use super::*;

const GIB: u64 = 1 << 30;

fn stats(allocated: u64, reserved: u64) -> Stats {
    Stats {
        allocated: Some(allocated),
        reserved: Some(reserved),
        inactive_split: Some(GIB / 4),
        ..Stats::default()
    }
}

fn inputs(s: &Stats) -> Inputs<'_> {
    Inputs {
        nvml_used: Some(71 * GIB),
        poll_ts: Some(100.0),
        stats: Some(s),
        sample_ts: Some(99.5),
        sessions_sharing: 1,
    }
}

#[test]
fn the_parts_add_up_to_nvml_s_figure() {
    let s = stats(52 * GIB, 66 * GIB);
    let l = ledger(&inputs(&s));
    assert_eq!(l.unknown, None);
    assert_eq!(l.allocated_bytes, Some(52 * GIB));
    assert_eq!(l.cached_bytes, Some(14 * GIB));
    assert_eq!(l.cached_fragmented_bytes, Some(GIB / 4));
    assert_eq!(l.outside_allocator_bytes, Some(5 * GIB));
    assert_eq!(
        l.allocated_bytes.unwrap() + l.cached_bytes.unwrap() + l.outside_allocator_bytes.unwrap(),
        l.nvml_used_bytes.unwrap()
    );
    assert_eq!(l.age_seconds, Some(0.5));
}

#[test]
fn what_cannot_be_known_is_said_not_guessed() {
    let s = stats(52 * GIB, 66 * GIB);
    type Change = Box<dyn Fn(&mut Inputs)>;
    let cases: [(Change, &str); 5] = [
        (Box::new(|i| i.nvml_used = None), "no per-process figure"),
        (Box::new(|i| i.stats = None), "no reserved_bytes"),
        (Box::new(|i| i.sessions_sharing = 2), "share this process"),
        (Box::new(|i| i.sample_ts = Some(10.0)), "90 s apart"),
        (Box::new(|i| i.nvml_used = Some(60 * GIB)), "reserves more"),
    ];
    for (change, why) in cases {
        let mut i = inputs(&s);
        change(&mut i);
        let l = ledger(&i);
        assert_eq!(l.outside_allocator_bytes, None, "{why}");
        assert!(
            l.unknown.as_deref().is_some_and(|u| u.contains(why)),
            "{l:?}"
        );
    }
    // A moment's skew (reserved a little above NVML's figure) reads as nothing outside.
    let mut i = inputs(&s);
    i.nvml_used = Some(66 * GIB - (1 << 20));
    assert_eq!(ledger(&i).outside_allocator_bytes, Some(0));
}
