use super::*;
use crate::core::trainer::{Sample, Stats};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const TOTAL: u64 = 85_520_809_984;

/// 4.5 GiB reserved, 1.5 GiB of it unusable at the peak, 74 GiB of the device free.
fn fragmented() -> Sample {
    Sample {
        ts: 1_763_700_000.0,
        step: Some(10),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(2 * GIB),
            allocated_peak: Some(3 * GIB),
            reserved: Some(4 * GIB + 512 * MIB),
            ..Stats::default()
        },
        device_free: Some(74 * GIB),
        device_total: Some(TOTAL),
        alloc_limit: None,
        categories: None,
    }
}

fn active(cap: Option<u64>) -> Option<Signal> {
    let s = fragmented();
    let obs = Obs {
        alloc_limit: cap,
        ..Obs::of(&s)
    };
    Fragmentation::new().sample(&obs)
}

#[test]
fn full_means_near_the_cap_when_there_is_one() {
    // 74 GiB free on the device: not full, not worth a finding.
    assert!(!active(None).unwrap().active);
    // Capped at 4.75 GiB: 256 MiB left, under 10% of the cap.
    let sig = active(Some(4 * GIB + 768 * MIB)).unwrap();
    assert!(sig.active);
    assert_eq!(sig.evidence.alloc_limit, Some(4 * GIB + 768 * MIB));
    let m = crate::core::detect::message::describe(Kind::Fragmentation, &sig.evidence);
    assert!(
        m.ends_with("while the process is near the 4.75 GiB allowed"),
        "{m}"
    );
    // A cap with room to spare is not full either.
    assert!(!active(Some(8 * GIB)).unwrap().active);
}
