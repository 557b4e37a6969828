use super::*;
use crate::core::detect::explanation::{Explanation, Pattern};
use crate::core::detect::message;
use crate::core::trainer::{Sample, Stats};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const TOTAL: u64 = 85_520_809_984;
const CAP: u64 = 4 * GIB + 768 * MIB;

fn sample(step: u64, ts: f64, ooms: u64) -> Sample {
    Sample {
        ts,
        step: Some(step),
        phase: "train".into(),
        stats: Stats {
            reserved: Some(4 * GIB + 655 * MIB),
            ooms: Some(ooms),
            ..Stats::default()
        },
        device_free: Some(74 * GIB),
        device_total: Some(TOTAL),
        alloc_limit: None,
        categories: None,
    }
}

/// The detector's signal for a sample: None when nothing changed since the last one.
fn feed(d: &mut Oom, s: &Sample, cap: Option<u64>) -> Option<Signal> {
    let obs = Obs {
        ooms_total: s.stats.ooms.unwrap_or(0),
        alloc_limit: cap,
        ..Obs::of(s)
    };
    d.sample(&obs)
}

fn oom_event(ts: f64, alloc_limit: Option<u64>) -> EventRecord {
    EventRecord {
        ts,
        kind: "oom".into(),
        detail: None,
        alloc_bytes: Some(384 * MIB),
        device_free: Some(74 * GIB),
        alloc_limit,
    }
}

/// The real H100 fragmentation OOM (tests/fixtures/oom).
pub(crate) fn fragmentation() -> Explanation {
    serde_json::from_str(include_str!(
        "../../../../../../tests/fixtures/oom/fragmentation.json"
    ))
    .unwrap()
}

/// Its event: 1.5 GiB asked under a 4 GiB cap, at step 220.
fn explained(x: &Explanation) -> Signal {
    let mut d = Oom::new();
    let mut s = sample(220, 100.0, 0);
    s.stats.reserved = Some(3 * GIB);
    feed(&mut d, &s, Some(4 * GIB));
    let e = EventRecord {
        alloc_bytes: Some(1_610_612_736),
        ..oom_event(100.5, Some(4 * GIB))
    };
    d.event(&e, Some(x)).unwrap()
}

#[test]
fn an_oom_under_a_cap_names_the_cap_not_the_free_device() {
    let mut d = Oom::new();
    feed(&mut d, &sample(1200, 100.0, 0), Some(CAP));
    let sig = d.event(&oom_event(100.5, Some(CAP)), None).unwrap();
    let m = message::describe(Kind::Oom, &sig.evidence);
    assert_eq!(
        m,
        "CUDA out of memory: tried to allocate 384.0 MiB with 4.64 GiB of the 4.75 GiB allowed already reserved at step 1,200"
    );
    assert!(message::hint(Kind::Oom, &sig.evidence)
        .unwrap()
        .contains("set_per_process_memory_fraction"));
}

#[test]
fn without_a_cap_the_message_is_unchanged() {
    let mut d = Oom::new();
    feed(&mut d, &sample(1200, 100.0, 0), None);
    // torch's observer reports the device total as the limit when no fraction is set.
    let sig = d.event(&oom_event(100.5, Some(TOTAL)), None).unwrap();
    assert_eq!(sig.evidence.alloc_limit, None);
    assert_eq!(sig.evidence.explanation, None);
    assert_eq!(
        message::describe(Kind::Oom, &sig.evidence),
        "CUDA out of memory: tried to allocate 384.0 MiB with 74.0 GiB free at step 1,200"
    );
}

#[test]
fn an_oom_seen_only_in_the_counter_names_the_cap_too() {
    let mut d = Oom::new();
    feed(&mut d, &sample(10, 100.0, 0), Some(CAP));
    let sig = feed(&mut d, &sample(11, 101.0, 1), Some(CAP)).unwrap();
    assert!(sig.active);
    assert_eq!(
        message::describe(Kind::Oom, &sig.evidence),
        "CUDA out of memory with 4.64 GiB of the 4.75 GiB allowed already reserved at step 11"
    );
    // The sample that showed it was taken after it; the next one says the run went on.
    let sig = feed(&mut d, &sample(12, 102.0, 1), Some(CAP)).unwrap();
    assert_eq!(
        (sig.evidence.survived, sig.evidence.survived_step),
        (Some(true), Some(12))
    );
}

/// Whether the OOM is active after each sample, keeping the last signal's answer when the
/// detector had nothing new to say.
struct Held {
    d: Oom,
    active: bool,
}

impl Held {
    fn feed(&mut self, s: &Sample) -> bool {
        if let Some(sig) = feed(&mut self.d, s, None) {
            self.active = sig.active;
        }
        self.active
    }
}

/// Held for 100 steps and 5 minutes, however many samples that is.
#[test]
fn an_oom_is_held_in_steps_and_seconds() {
    let mut h = Held {
        d: Oom::new(),
        active: false,
    };
    h.feed(&sample(1, 0.0, 0));
    h.active = h.d.event(&oom_event(0.5, None), None).unwrap().active;
    // Dense: 10 samples a second, 1,000 samples in 100 s: still held.
    for i in 1..=1000u64 {
        assert!(h.feed(&sample(i, i as f64 / 10.0, 1)));
    }
    assert!(!h.feed(&sample(3000, 300.6, 1)));
    // Sparse: a sample every 50 steps of 6 s. The counter shows the OOM at step 51; two
    // samples later (100 steps, 600 s) it is over.
    let mut h = Held {
        d: Oom::new(),
        active: false,
    };
    h.feed(&sample(1, 0.0, 0));
    h.active = h.d.event(&oom_event(0.5, None), None).unwrap().active;
    assert!(h.feed(&sample(51, 300.0, 1)));
    assert!(h.feed(&sample(101, 600.0, 1)));
    assert!(!h.feed(&sample(151, 900.0, 1)));
}

/// A held OOM's evidence (and its explanation) is sent again only when it changes.
#[test]
fn signals_come_only_when_something_changed() {
    let x = fragmentation();
    let mut d = Oom::new();
    feed(&mut d, &sample(220, 100.0, 0), Some(4 * GIB));
    assert!(d
        .event(&oom_event(100.5, Some(4 * GIB)), Some(&x))
        .is_some());
    let went_on = feed(&mut d, &sample(221, 101.0, 1), Some(4 * GIB)).unwrap();
    assert!(went_on.active && went_on.evidence.survived == Some(true));
    assert_eq!(went_on.evidence.explanation.as_deref(), Some(&x));
    for i in 2..50u64 {
        assert!(feed(&mut d, &sample(220 + i, 100.0 + i as f64, 1), Some(4 * GIB)).is_none());
    }
    // A second OOM: the run has not gone on from this one yet.
    let again = d.event(&oom_event(160.0, Some(4 * GIB)), None).unwrap();
    assert_eq!(again.evidence.survived, None);
    assert_eq!(again.evidence.explanation, None);
}

#[test]
fn an_explained_fragmentation_names_the_pattern_the_line_and_what_held_the_memory() {
    let x = fragmentation();
    let sig = explained(&x);
    assert_eq!(sig.evidence.explanation.as_deref(), Some(&x));
    assert_eq!(
        message::describe(Kind::Oom, &sig.evidence),
        "CUDA out of memory (fragmentation): tried to allocate 1.5 GiB at oomlib.py:37 with 3.58 GiB of the 4.00 GiB allowed already reserved; 2.3 GiB of the cache was free but its largest free block was 13.0 MiB; 95% of live memory was allocated at oomlib.py:32 at step 220"
    );
    let hint = message::hint(Kind::Oom, &sig.evidence).unwrap();
    assert!(hint.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
    assert!(hint.contains("shapes steadier"));
    // The client's own message is not the finding's.
    assert!(!message::describe(Kind::Oom, &sig.evidence).contains(&x.message));
    let mut went_on = sig.evidence.clone();
    (went_on.survived, went_on.survived_step) = (Some(true), Some(221));
    assert!(message::describe(Kind::Oom, &went_on)
        .ends_with("oomlib.py:32 at step 220; the run went on (step 221)"));
}

#[test]
fn pressure_says_what_did_not_fit() {
    let mut x = fragmentation();
    x.pattern = Pattern::Pressure;
    let m = message::describe(Kind::Oom, &explained(&x).evidence);
    assert!(
        m.starts_with("CUDA out of memory (pressure): tried to allocate 1.5 GiB at oomlib.py:37 with 3.58 GiB of the 4.00 GiB allowed already reserved; the request plus the 1.3 GiB live (2.8 GiB) is more than the 4.00 GiB allowed;"),
        "{m}"
    );
    // Under a cap, the cap's own remedy; without one, the pressure remedies.
    let sig = explained(&x);
    assert!(message::hint(Kind::Oom, &sig.evidence)
        .unwrap()
        .contains("set_per_process_memory_fraction"));
    let mut e = sig.evidence.clone();
    e.alloc_limit = None;
    let hint = message::hint(Kind::Oom, &e).unwrap();
    for w in [
        "gradient accumulation",
        "activation checkpointing",
        "mixed precision",
    ] {
        assert!(hint.contains(w), "{w} in {hint}");
    }
    // A request larger than the limit by itself.
    x.request_bytes = Some(6 * GIB);
    let m = message::describe(Kind::Oom, &explained(&x).evidence);
    assert!(
        m.contains("tried to allocate 6.0 GiB at oomlib.py:37")
            && m.contains("; the request alone is more than the 4.00 GiB allowed;"),
        "{m}"
    );
}

#[test]
fn a_leak_names_its_top_live_site_in_message_and_hint() {
    let mut x = fragmentation();
    x.pattern = Pattern::Leak;
    x.live_sites[0].function = "kept_outputs".into();
    let sig = explained(&x);
    let m = message::describe(Kind::Oom, &sig.evidence);
    assert!(
        m.starts_with("CUDA out of memory (leak):")
            && m.contains("; memory kept from earlier steps filled the cache; 95% of live memory was allocated at oomlib.py:32 at step 220"),
        "{m}"
    );
    let hint = message::hint(Kind::Oom, &sig.evidence).unwrap();
    assert!(hint.contains("at oomlib.py:32 in kept_outputs"), "{hint}");
    assert!(
        hint.contains("loss.item()") && hint.contains("detach()"),
        "{hint}"
    );
}

#[test]
fn unknown_says_its_first_reason_and_unknown_lines_say_why() {
    let mut x = fragmentation();
    x.pattern = Pattern::Unknown;
    x.reasons = vec!["the snapshot holds no segments".into(), "second".into()];
    let m = message::describe(Kind::Oom, &explained(&x).evidence);
    assert!(
        m.contains("(unknown)") && m.contains("; the snapshot holds no segments;"),
        "{m}"
    );
    assert!(!m.contains("second"));
    // Generic remedy for what is not decided.
    assert!(message::hint(Kind::Oom, &explained(&x).evidence)
        .unwrap()
        .contains("set_per_process_memory_fraction"));
    // History on, but the OOM came from no Python frame.
    let mut x = fragmentation();
    x.failing_site = None;
    let m = message::describe(Kind::Oom, &explained(&x).evidence);
    assert!(m.contains("tried to allocate 1.5 GiB at an unknown line (no Python frame: raised inside backward, say) with"), "{m}");
    // History off: no lines at all, and the message says so.
    x.history = false;
    x.live_sites.clear();
    let m = message::describe(Kind::Oom, &explained(&x).evidence);
    assert!(
        m.starts_with(
            "CUDA out of memory (fragmentation): tried to allocate 1.5 GiB with 3.58 GiB"
        ) && m
            .ends_with("; the lines are unknown: allocation history was not recording at step 220"),
        "{m}"
    );
}
