//! near_limit against the allocator's real limit, and one episode per stretch of pressure.

use crate::core::detect::findings::{FindingState, Findings, Subject};
use crate::core::detect::{DetectConfig, Kind, Obs, SessionDetect};
use crate::core::trainer::{Sample, Stats};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// H100 80GB as torch reports it.
const TOTAL: u64 = 85_520_809_984;
/// `set_per_process_memory_fraction` giving 4.75 GiB.
const CAP: u64 = 4 * GIB + 768 * MIB;

struct Run {
    detect: SessionDetect,
    findings: Findings,
    who: Subject,
    retries: u64,
}

impl Run {
    fn new() -> Self {
        Self {
            detect: SessionDetect::new(&DetectConfig::default()),
            findings: Findings::default(),
            who: Subject::default(),
            retries: 0,
        }
    }

    /// One sample; `retries` new allocator retries since the last one.
    fn sample(&mut self, s: Sample, new_retries: u64, cap: Option<u64>) {
        self.retries += new_retries;
        let s = Sample {
            stats: Stats {
                alloc_retries: Some(self.retries),
                ..s.stats
            },
            ..s
        };
        let obs = Obs {
            sample: &s,
            retries_total: self.retries,
            ooms_total: 0,
            alloc_limit: cap,
            outside: None,
            categories: None,
            world_size: None,
            alloc_conf: None,
        };
        self.detect.sample(&self.who, &obs, &mut self.findings);
    }

    /// Times near_limit fired (episodes), and whether it is firing now.
    fn near_limit(&self) -> (u64, bool) {
        let fired = self
            .findings
            .totals()
            .find(|(k, _)| *k == Kind::NearLimit)
            .map_or(0, |(_, n)| n);
        (fired, self.detect.firing(Kind::NearLimit).is_some())
    }
}

/// A trainer on an H100: `reserved` and `peak` as given, the rest of the device free.
fn sample(step: u64, ts: f64, reserved: u64, peak: u64) -> Sample {
    Sample {
        ts: 1_763_700_000.0 + ts,
        step: Some(step),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(peak - GIB),
            allocated_peak: Some(peak),
            reserved: Some(reserved),
            ..Stats::default()
        },
        device_free: Some(TOTAL - reserved - 512 * MIB),
        device_total: Some(TOTAL),
        alloc_limit: None,
        categories: None,
    }
}

/// 4.65 GiB reserved (98% of the cap), peaks 60 MiB under it.
fn capped_trainer(step: u64) -> Sample {
    let reserved = CAP / 100 * 98;
    sample(step, step as f64 * 0.3, reserved, reserved - 60 * MIB)
}

#[test]
fn a_trainer_at_98_percent_of_its_cap_is_near_the_limit() {
    let mut r = Run::new();
    for step in 1..=200 {
        r.sample(capped_trainer(step), 0, Some(CAP));
    }
    assert_eq!(r.near_limit(), (1, true));
    let f = r.detect.firing(Kind::NearLimit).unwrap();
    let h = f.evidence.headroom_bytes.unwrap();
    // The cap less the peak, not the 74 GiB the device has free.
    assert!(h > 0 && h < 200 * MIB as i64, "{h}");
    assert_eq!(f.evidence.alloc_limit, Some(CAP));
    assert!(
        f.message.contains("of the 4.75 GiB allowed"),
        "{}",
        f.message
    );
    assert!(f
        .hint
        .as_deref()
        .unwrap()
        .contains("set_per_process_memory_fraction"));

    // The same numbers without the cap: 74 GiB of headroom, nothing to say.
    let mut r = Run::new();
    for step in 1..=200 {
        r.sample(capped_trainer(step), 0, None);
    }
    assert_eq!(r.near_limit(), (0, false));
}

/// The margin (512 MiB by default) is at most a tenth of the cap: a trainer capped at 2 GiB
/// whose peaks use 80% of it (410 MiB of headroom) is fine; at 96% (82 MiB) it is near the
/// limit. Under a 40 GiB cap the configured 512 MiB still applies.
#[test]
fn under_a_small_cap_the_margin_is_a_tenth_of_it() {
    let run = |cap: u64, peak: u64| {
        let mut r = Run::new();
        for step in 1..=200 {
            r.sample(sample(step, step as f64 * 0.3, cap, peak), 0, Some(cap));
        }
        r.near_limit()
    };
    let small = 2 * GIB;
    assert_eq!(run(small, small / 100 * 80), (0, false));
    assert_eq!(run(small, small / 100 * 96), (1, true));
    // Headroom 400 MiB: under 512 MiB, and 512 MiB is under a tenth of 40 GiB.
    assert_eq!(run(40 * GIB, 40 * GIB - 400 * MIB), (1, true));
    assert_eq!(run(40 * GIB, 40 * GIB - 600 * MIB), (0, false));
}

#[test]
fn a_cap_at_the_device_total_is_no_cap() {
    let mut r = Run::new();
    for step in 1..=200 {
        r.sample(capped_trainer(step), 0, Some(TOTAL));
    }
    assert_eq!(r.near_limit(), (0, false));
}

/// The real trainer's pattern: retries in bursts every ~50 steps (45 to 70, one or two retries
/// each), headroom otherwise fine, over 1,900 steps. Sampled every step (where a window of 100
/// samples used to let it resolve and fire again nine times) and at the client's cadence (every
/// 1 to 6 steps, irregular). One episode, not one per gap; and when the bursts stop it resolves
/// once, after the quiet period.
#[test]
fn retries_in_bursts_keep_one_episode() {
    let every_step = |_: u64| 1u64;
    let irregular = |k: u64| 1 + (k * 7 % 6);
    for (cadence, next) in [
        ("every step", &every_step as &dyn Fn(u64) -> u64),
        ("irregular", &irregular),
    ] {
        let mut r = Run::new();
        let (mut step, mut k, mut next_burst, mut last_retry) = (0u64, 0u64, 40u64, 0u64);
        while step < 1_900 {
            k += 1;
            step += next(k);
            let mut new = 0;
            if step >= next_burst {
                new = if k % 4 == 0 { 2 } else { 1 };
                last_retry = step;
                next_burst = step + 45 + (k * 17 % 26);
            }
            // 20 GiB reserved, the peak 2 GiB under it, no cap: plenty of headroom.
            r.sample(
                sample(step, step as f64 * 0.4, 20 * GIB, 18 * GIB),
                new,
                None,
            );
            if step > 150 {
                assert_eq!(r.near_limit(), (1, true), "{cadence}: step {step}");
            }
        }
        let f = r.detect.firing(Kind::NearLimit).unwrap();
        assert!(f.evidence.retries.unwrap() >= 2);
        assert!(f.message.starts_with("the allocator retried cudaMalloc"));
        assert!(!f.message.contains("allowed"), "{}", f.message);

        // The bursts stop. The last retries leave the window after 300 s (750 steps of 0.4 s),
        // then the quiet period (100 steps and 2 minutes: 300 steps) runs out.
        let mut resolved_at = None;
        while step < 4_000 && resolved_at.is_none() {
            step += next(k);
            k += 1;
            r.sample(sample(step, step as f64 * 0.4, 20 * GIB, 18 * GIB), 0, None);
            if !r.near_limit().1 {
                resolved_at = Some(step);
            }
        }
        let quiet = resolved_at.unwrap() - last_retry;
        assert!(
            (900..=1_100).contains(&quiet),
            "{cadence}: resolved {quiet} steps after the last retry"
        );
        assert_eq!(r.near_limit(), (1, false));
        let resolved = r.findings.recent().last().unwrap();
        assert_eq!(resolved.state, FindingState::Resolved);
    }
}

/// Sparse samples (every 10 steps of 5 s) still show a tight trainer; one tight sample among
/// roomy ones does not.
#[test]
fn headroom_is_judged_on_steps_not_sample_counts() {
    let mut r = Run::new();
    for k in 1..=5u64 {
        let step = k * 10;
        r.sample(
            sample(step, step as f64 * 5.0, 40 * GIB, 40 * GIB),
            0,
            Some(40 * GIB + 100 * MIB),
        );
    }
    assert_eq!(r.near_limit(), (1, true));

    let mut r = Run::new();
    for step in 1..=300u64 {
        let peak = if step == 150 { 40 * GIB } else { 30 * GIB };
        r.sample(
            sample(step, step as f64 * 0.1, 40 * GIB, peak),
            0,
            Some(40 * GIB + 100 * MIB),
        );
    }
    assert_eq!(r.near_limit(), (0, false));
}

/// Retries the trainer had before it connected (a client attached mid-run) are not "recent".
#[test]
fn retries_from_before_the_session_do_not_count() {
    let mut r = Run::new();
    r.retries = 50;
    for step in 1..=50u64 {
        r.sample(sample(step, step as f64, 20 * GIB, 18 * GIB), 0, None);
    }
    assert_eq!(r.near_limit(), (0, false));
}

/// Retries in bursts of 2 every 250 steps of 3 s, the step count starting over every 200 steps
/// (a per-epoch `step`): within 300 steps there are always 2 retries, so one episode. Counted in
/// seconds only across a reset (as the windows were), a burst's retries left the window 5
/// minutes after it, the finding resolved 2 minutes later and fired again at the next burst.
#[test]
fn retries_across_step_resets_keep_one_episode() {
    let mut r = Run::new();
    for i in 0..3_000u64 {
        let new = if i % 250 == 1 { 2 } else { 0 };
        r.sample(
            sample(i % 200, i as f64 * 3.0, 20 * GIB, 18 * GIB),
            new,
            None,
        );
        if i > 1 {
            assert_eq!(r.near_limit(), (1, true), "sample {i}");
        }
    }
}
