//! A trainer whose step count starts over (a per-epoch `step`, a restarted loop counter): the
//! leak is judged on a step axis that continues across the reset, so one leak is one episode.

use crate::core::detect::findings::{FindingState, Findings, Subject};
use crate::core::detect::{DetectConfig, Kind, Obs, SessionDetect};
use crate::core::trainer::{Sample, Stats};

use super::{noise, GIB, MIB, TOTAL};

/// Raises and resolves of leak and near_limit after feeding `n` samples, one every `every` steps,
/// whose step count starts over every `reset` samples; the floor by sample index.
fn episodes(
    n: usize,
    reset: usize,
    every: u64,
    floor: impl Fn(usize) -> f64,
) -> [(Kind, u64, usize); 2] {
    let mut d = SessionDetect::new(&DetectConfig::default());
    let mut findings = Findings::default();
    let who = Subject::default();
    for i in 0..n {
        let f = floor(i) as u64;
        let s = Sample {
            ts: 1_763_700_000.0 + i as f64 * 0.05,
            step: Some((i % reset) as u64 * every),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(f),
                allocated_peak: Some(f + 10 * (1 << 30)),
                reserved: Some(f + 12 * (1 << 30)),
                ..Stats::default()
            },
            device_free: Some(TOTAL - f - 12 * (1 << 30)),
            device_total: Some(TOTAL),
            alloc_limit: None,
            categories: None,
        };
        let obs = Obs::of(&s);
        d.sample(&who, &obs, &mut findings);
    }
    [Kind::Leak, Kind::NearLimit].map(|kind| {
        let fired = findings
            .totals()
            .find(|(k, _)| *k == kind)
            .map_or(0, |t| t.1);
        let resolved = findings
            .recent()
            .filter(|f| f.kind == kind && f.state == FindingState::Resolved)
            .count();
        (kind, fired, resolved)
    })
}

/// 4 MiB a sample for 3,000 samples, the count starting over every 200 samples: the memory that
/// survives each step grows straight through every reset. Sampled every step the old detector
/// never raised it (its windows ran backwards); sampled every 2 to 8 steps it raised and
/// resolved it 13 to 15 times.
#[test]
fn a_leak_across_step_resets_is_one_episode() {
    let floor = |i: usize| 20.0 * GIB + i as f64 * 4.0 * MIB + noise(i, 5) * 64.0 * MIB;
    for every in [1, 2, 8] {
        let [leak, near] = episodes(3_000, 200, every, floor);
        assert_eq!(leak, (Kind::Leak, 1, 0), "every {every} steps");
        assert_eq!(near, (Kind::NearLimit, 0, 0), "every {every} steps");
        // The same leak without resets: one episode too.
        let [leak, _] = episodes(3_000, usize::MAX, every, floor);
        assert_eq!(leak, (Kind::Leak, 1, 0), "every {every} steps, no reset");
    }
}

#[test]
fn a_healthy_trainer_with_step_resets_raises_nothing() {
    for seed in 0..3 {
        let floor = |i: usize| 20.0 * GIB + noise(i, seed) * 800.0 * MIB;
        for every in [1, 8] {
            let [leak, near] = episodes(10_000, 200, every, floor);
            assert_eq!(leak, (Kind::Leak, 0, 0), "seed {seed}, every {every} steps");
            assert_eq!(
                near,
                (Kind::NearLimit, 0, 0),
                "seed {seed}, every {every} steps"
            );
        }
    }
}
