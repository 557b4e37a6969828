use super::*;
use crate::frontends::demo::profile::{Profile, DRIVER_RESERVED};
use crate::frontends::demo::scenario;
use crate::sources::ingest::protocol::{parse, Message};

#[test]
fn rank_2_peaks_highest_and_every_rank_keeps_its_peak_under_its_reserve() {
    for t in [0.0, 10.0, 40.0, FAIL_AT - 0.1] {
        let peak = |r| at(r, t).1.allocated_peak.unwrap();
        let top = (0..WORLD_SIZE).max_by_key(|r| peak(*r)).unwrap();
        assert_eq!(top, FAILING_RANK, "{t}");
        for r in 0..WORLD_SIZE {
            let (step, s) = at(r, t);
            assert_eq!(step, at(0, t).0, "the ranks step together");
            assert!(s.allocated_peak.unwrap() < s.reserved.unwrap());
            assert_eq!(nvml_used(r), s.reserved.unwrap() + CONTEXT as u64);
        }
    }
}

#[test]
fn rank_2_fails_first_and_the_rest_follow_within_two_seconds() {
    for r in 0..WORLD_SIZE {
        let after = end(r) - end(FAILING_RANK);
        if r == FAILING_RANK {
            assert_eq!(after, 0.0);
        } else {
            assert!((1.0..=2.0).contains(&after), "rank {r}: {after}");
        }
    }
    assert!((60.0..=90.0).contains(&FAIL_AT));
    assert!(launched(0.0) && launched(FAIL_AT - 5.0));
    assert!(!launched(FAIL_AT) && !launched(670.0));
}

#[test]
fn gpu_0_holds_the_ranks_while_they_live_and_never_overcommits() {
    let all: u64 = (0..WORLD_SIZE).map(nvml_used).sum();
    assert_eq!(used_on(GPU, 1.0), all);
    assert_eq!(used_on(1, 1.0), 0);
    // Rank 2 gone, the others not yet.
    assert_eq!(used_on(GPU, FAIL_AT + 0.5), all - nvml_used(FAILING_RANK));
    assert_eq!(used_on(GPU, FAIL_AT + 2.0), 0);
    let ranks_free = |t: f64| device_free(GPU, t) + used_on(GPU, t);
    for i in 0..200 {
        let t = f64::from(i) * 0.5;
        assert!(device_free(GPU, t) > 0, "GPU 0 full at {t}");
        // The single trainers see the ranks: free memory is theirs less the ranks'.
        let alone: u64 = crate::frontends::demo::profile::ALL
            .iter()
            .filter(|p| p.gpu() == GPU)
            .map(|p| p.nvml_used(t))
            .sum();
        assert_eq!(ranks_free(t), TOTAL - DRIVER_RESERVED - alone);
    }
}

#[test]
fn the_oom_asks_for_more_than_the_gpu_and_the_cache_had() {
    let e = oom_event(1.8e9);
    let Ok(Message::Event(ev)) = parse(e.to_string().as_bytes()) else {
        panic!("the daemon refuses {e}");
    };
    let free = ev.device_free.unwrap();
    // What the last sample (a step before) saw.
    assert!(free.abs_diff(device_free(GPU, FAIL_AT - 0.2)) <= 32 << 20);
    let (_, s) = at(FAILING_RANK, FAIL_AT - 1e-6);
    let cached = s.reserved.unwrap() - s.allocated_peak.unwrap();
    assert!(free + cached < ALLOC_BYTES, "{free} + {cached}");
    // Enough free that nobody else on GPU 0 is near the edge.
    assert!(free as f64 > 8.0 * GIB, "{free}");
    let text = exception();
    assert!(
        text.starts_with("OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 79.65 GiB of which "),
        "{text}"
    );
    assert!(
        text.contains(&format!("of which {} is free", human(free))),
        "{text}"
    );
    assert!(text.len() <= MAX_DIED);
}

#[test]
fn the_simulated_nvml_lists_each_rank_until_it_dies() {
    let ranks: Vec<(u64, u32)> = (0..WORLD_SIZE).map(|r| (r, 5000 + r as u32)).collect();
    let text = scenario::toml(&[(Profile::Healthy, 4000)], &ranks);
    for (r, pid) in &ranks {
        let entry = format!(
            "pid = {pid}\nname = \"gpumon\"\nused = {}\nend = {:.3}\n",
            nvml_used(*r),
            end(*r)
        );
        assert!(text.contains(&entry), "{text}");
    }
    // On GPU 0: listed before the second GPU starts.
    let gpu1 = text.rfind("[[gpu]]").unwrap();
    assert!(text.find("pid = 5003").unwrap() < gpu1);
    assert_eq!(scenario::toml(&[], &[]).matches("pid =").count(), 0);
}
