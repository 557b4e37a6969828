use super::*;
use crate::ingest::protocol::{Sample, Stats};

const GIB: f64 = 1073741824.0;
const MIB: f64 = 1048576.0;
const TOTAL: u64 = 85_520_809_984;

/// Feeds floors (one per step) and returns the first step at which the leak signal is active.
fn first_active(floors: impl IntoIterator<Item = f64>) -> Option<u64> {
    let mut d = Leak::new(0.005);
    for (i, f) in floors.into_iter().enumerate() {
        let step = i as u64;
        let s = Sample {
            ts: 1_763_700_000.0 + step as f64 * 0.5,
            step: Some(step),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(f as u64),
                allocated_peak: Some(f as u64 + (10.0 * GIB) as u64),
                reserved: Some(f as u64 + (12.0 * GIB) as u64),
                ..Stats::default()
            },
            device_free: Some(TOTAL - f as u64 - (12.0 * GIB) as u64),
            device_total: Some(TOTAL),
            alloc_limit: None,
        };
        let obs = Obs {
            sample: &s,
            retries_total: 0,
            ooms_total: 0,
            alloc_limit: None,
        };
        if d.sample(&obs).is_some_and(|sig| sig.active) {
            return Some(step);
        }
    }
    None
}

/// Deterministic pseudo-noise in [0, 1).
fn noise(i: usize, seed: u64) -> f64 {
    let mut x = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x % 1_000_000) as f64 / 1_000_000.0
}

#[test]
fn a_flat_noisy_floor_is_not_a_leak() {
    for seed in 0..5 {
        let f = (0..20_000).map(|i| 20.0 * GIB + noise(i, seed) * 800.0 * MIB);
        assert_eq!(first_active(f), None, "seed {seed}");
    }
}

#[test]
fn warm_up_then_one_level_shift_is_not_a_leak() {
    let f = (0..20_000).map(|i| {
        let warm = if i < 3 {
            i as f64 * 4.0 * GIB
        } else {
            12.0 * GIB
        };
        let shift = if i > 8_000 { 6.0 * GIB } else { 0.0 };
        10.0 * GIB + warm + shift + noise(i, 9) * 100.0 * MIB
    });
    assert_eq!(first_active(f), None);
}

#[test]
fn a_linear_leak_is_caught_before_it_grows_2_gib() {
    let onset = 2_000;
    let f = (0..30_000).map(|i| {
        let leak = if i > onset {
            (i - onset) as f64 * 2.0 * MIB
        } else {
            0.0
        };
        20.0 * GIB + leak + noise(i, 3) * 300.0 * MIB
    });
    let at = first_active(f).expect("leak caught");
    let grown = (at - onset as u64) as f64 * 2.0 * MIB;
    assert!(
        grown < 2.0 * GIB,
        "caught at step {at}, after {grown} bytes"
    );
}

#[test]
fn a_staircase_leak_is_caught_and_an_accumulation_sawtooth_alone_is_not() {
    let stairs = (0..40_000).map(|i| 20.0 * GIB + (i / 1_000) as f64 * 300.0 * MIB);
    let at = first_active(stairs).expect("staircase caught");
    assert!(at < 8_000, "caught at {at}");
    let saw = (0..20_000).map(|i| 20.0 * GIB + (i % 8) as f64 * 500.0 * MIB);
    assert_eq!(first_active(saw), None);
    let saw_leak = (0..20_000).map(|i| 20.0 * GIB + (i % 8) as f64 * 500.0 * MIB + i as f64 * MIB);
    assert!(first_active(saw_leak).is_some());
}

#[test]
fn immaterial_drift_raises_nothing() {
    // 2 KiB/step on an 80 GB device: 100 MB over 50k steps.
    let f = (0..50_000).map(|i| 20.0 * GIB + i as f64 * 2048.0);
    assert_eq!(first_active(f), None);
}

#[test]
fn memory_is_bounded_over_a_very_long_run() {
    let mut d = Leak::new(0.005);
    for i in 0..400_000u64 {
        let s = Sample {
            ts: i as f64,
            step: Some(i),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(1 << 30),
                ..Stats::default()
            },
            device_free: None,
            device_total: None,
            alloc_limit: None,
        };
        d.sample(&Obs {
            sample: &s,
            retries_total: 0,
            ooms_total: 0,
            alloc_limit: None,
        });
    }
    assert!(d.levels.len() <= LEVELS);
    assert!(d.levels.iter().all(|l| l.done.len() <= KEEP));
}

/// A trainer capped at 8 GiB of an 80 GB device leaking 1 MiB/step: the forecast is to the cap
/// (where torch will raise the OOM), not to the device's free memory, and the message says so.
#[test]
fn under_a_cap_the_forecast_is_to_the_cap() {
    let cap = (8.0 * GIB) as u64;
    let mut d = Leak::new(0.005);
    let mut last = None;
    for step in 0..3_000u64 {
        let floor = 2.0 * GIB + step.saturating_sub(200) as f64 * MIB;
        let s = Sample {
            ts: 1_763_700_000.0 + step as f64 * 0.5,
            step: Some(step),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(floor as u64),
                allocated_peak: Some((floor + GIB) as u64),
                reserved: Some((floor + 1.5 * GIB) as u64),
                ..Stats::default()
            },
            device_free: Some(TOTAL - (floor + 1.5 * GIB) as u64 - (GIB as u64)),
            device_total: Some(TOTAL),
            alloc_limit: None,
        };
        let obs = Obs {
            sample: &s,
            retries_total: 0,
            ooms_total: 0,
            alloc_limit: Some(cap),
        };
        if let Some(sig) = d.sample(&obs).filter(|sig| sig.active) {
            last = Some((step, sig));
            break;
        }
    }
    let (step, sig) = last.expect("the leak is caught");
    let e = &sig.evidence;
    // Peak is floor + 1 GiB; the cap is reached when the floor is 7 GiB: step 200 + 5,120.
    let predicted = step + e.oom_eta_steps.unwrap();
    assert!(
        (5_200..=5_450).contains(&predicted),
        "OOM forecast at step {predicted}"
    );
    assert_eq!(e.alloc_limit, Some(cap));
    let m = crate::detect::message::describe(Kind::Leak, e);
    assert!(
        m.contains("at this rate the 8.00 GiB allowed is used up in ~"),
        "{m}"
    );
}
