use super::super::*;
use crate::core::trainer::{Sample, Stats};

const GIB: f64 = 1073741824.0;
const MIB: f64 = 1048576.0;
/// An H100 80GB, and the CUDA context and NCCL outside the allocator.
const TOTAL: u64 = 85_520_809_984;
const OUTSIDE: u64 = 600 << 20;

/// Feeds (reserved, allocated) per step, sampling one step in `every`; returns the first step at
/// which cache_growth is active, with its signal. A leak detector sees the same samples: the
/// third value is whether it ever fired.
fn first_signal(
    run: impl IntoIterator<Item = (f64, f64)>,
    every: usize,
) -> (Option<(u64, Signal)>, bool) {
    let mut d = Leak::cache(0.005);
    let mut leak = Leak::new(0.005);
    let mut leaked = false;
    for (i, (r, a)) in run.into_iter().enumerate().step_by(every) {
        let step = i as u64;
        let s = Sample {
            ts: 1_763_700_000.0 + step as f64 * 0.25,
            step: Some(step),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(a as u64),
                allocated_peak: Some(a as u64 + (512.0 * MIB) as u64),
                reserved: Some(r as u64),
                ..Stats::default()
            },
            device_free: Some(TOTAL.saturating_sub(r as u64 + OUTSIDE)),
            device_total: Some(TOTAL),
            alloc_limit: None,
            categories: None,
        };
        let obs = Obs {
            alloc_conf: Some("max_split_size_mb:128,expandable_segments:True"),
            ..Obs::of(&s)
        };
        leaked |= leak.sample(&obs).is_some_and(|sig| sig.active);
        if let Some(sig) = d.sample(&obs).filter(|sig| sig.active) {
            return (Some((step, sig)), leaked);
        }
    }
    (None, leaked)
}

/// Deterministic pseudo-noise in [0, 1).
fn noise(i: usize, seed: u64) -> f64 {
    let mut x = (i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x % 1_000_000) as f64 / 1_000_000.0
}

/// Allocated at ~1 GiB, give or take what is alive at the step boundary.
fn allocated(i: usize, seed: u64) -> f64 {
    GIB + noise(i, seed ^ 0xA110C) * 240.0 * MIB
}

/// torch issue #123548 as the issue tried it: reserved creeps 138 MiB a step from 2 GiB while
/// allocated stays at ~1 GiB, on an 80 GB device, sampled every step and one step in 8.
#[test]
fn a_creeping_cache_is_flagged_before_half_the_device_with_its_forecast() {
    let limit = (TOTAL - OUTSIDE) as f64;
    for every in [1, 8] {
        for seed in 0..3 {
            let reserved = |i: usize| 2.0 * GIB + 138.0 * MIB * i as f64;
            let run = (0..2_000)
                .map(|i| (reserved(i), allocated(i, seed)))
                .take_while(|(r, _)| *r < limit);
            let (found, leaked) = first_signal(run, every);
            let (step, sig) = found.unwrap_or_else(|| panic!("every {every}, seed {seed}: never"));
            assert!(!leaked, "every {every}: a flat allocated floor is no leak");
            let at = reserved(step as usize);
            assert!(
                at < TOTAL as f64 / 2.0,
                "every {every}: flagged at step {step} with {:.1} GiB reserved",
                at / GIB
            );
            let e = &sig.evidence;
            let left = ((limit - at) / (138.0 * MIB)).floor();
            let eta = e.oom_eta_steps.expect("a forecast") as f64;
            assert!(
                (eta - left).abs() <= 0.35 * left,
                "every {every}: forecast {eta} steps, {left} really left"
            );
            let slope = e.slope_bytes_per_step.expect("a slope");
            assert!((slope / (138.0 * MIB) - 1.0).abs() < 0.1, "slope {slope}");
            let per_s = e.slope_bytes_per_second.expect("a slope per second");
            assert!((per_s / (4.0 * 138.0 * MIB) - 1.0).abs() < 0.1, "{per_s}/s");
            assert!(e.growth_bytes.is_some_and(|g| g > 0));
            assert!(e.onset_step.is_some_and(|s| s <= step));
            assert_eq!(e.reserved_bytes, Some(at as u64));
            assert!(e.allocated_bytes.is_some_and(|a| a < (2.0 * GIB) as u64));
            assert_eq!(
                e.alloc_conf.as_deref(),
                Some("max_split_size_mb:128,expandable_segments:True")
            );
        }
    }
}

/// A slower creep, still flat allocated: found, later, by the coarser levels.
#[test]
fn a_slow_creep_is_flagged_too() {
    for every in [1, 8] {
        let run = (0..20_000).map(|i| (4.0 * GIB + 4.0 * MIB * i as f64, allocated(i, 7)));
        let (found, _) = first_signal(run, every);
        let (step, _) = found.unwrap_or_else(|| panic!("every {every}: never"));
        // 4% of the device is ~800 steps of growth; a window or two to confirm it.
        assert!(step < 4_000, "every {every}: step {step}");
    }
}

/// Segments of 20-256 MiB, 2 MiB-rounded, as the caching allocator reserves them.
fn segment(i: usize, seed: u64) -> f64 {
    ((20.0 + noise(i, seed) * 236.0) / 2.0).round() * 2.0 * MIB
}

#[test]
fn warm_up_growth_that_plateaus_is_not_cache_growth() {
    for every in [1, 8] {
        for seed in 0..4 {
            // The cache grows for the first ~150 steps (compile, DDP buckets, the first
            // evaluations' shapes), slower and slower, then holds.
            let mut r = 3.0 * GIB;
            let run = (0..20_000).map(move |i| {
                if i < 160 && noise(i, seed) < 8.0 / (i as f64 + 8.0) {
                    r += segment(i, seed) * 4.0;
                }
                (r, allocated(i, seed))
            });
            let (found, leaked) = first_signal(run, every);
            assert!(found.is_none(), "every {every}, seed {seed}: {found:?}");
            assert!(!leaked);
        }
    }
}

#[test]
fn variable_lengths_stepping_up_to_the_longest_batch_are_not_cache_growth() {
    for every in [1, 8] {
        for seed in 0..4 {
            // Each batch's activations scale with its length; the cache holds the longest yet.
            let mut longest = 0.0_f64;
            let run = (0..20_000).map(move |i| {
                let len = noise(i, seed ^ 0x5E9);
                longest = longest.max(len * len * 24.0 * GIB);
                (4.0 * GIB + longest, allocated(i, seed))
            });
            let (found, _) = first_signal(run, every);
            assert!(found.is_none(), "every {every}, seed {seed}: {found:?}");
        }
    }
}

#[test]
fn an_evaluation_or_graph_capture_growing_the_cache_once_is_not_cache_growth() {
    for every in [1, 8] {
        for seed in 0..4 {
            let run = (0..20_000).map(move |i| {
                let mut r = 6.0 * GIB;
                // CUDA graphs captured at steps 300-302: a pool each.
                r += 3.0 * GIB * (i.clamp(300, 303) - 300) as f64;
                // Evaluations every 2,000 steps; the first one's shapes grow the cache once.
                if i >= 2_000 {
                    r += 8.0 * GIB;
                }
                (r + segment(i / 500, seed), allocated(i, seed))
            });
            let (found, _) = first_signal(run, every);
            assert!(found.is_none(), "every {every}, seed {seed}: {found:?}");
        }
    }
}

/// Live memory growing, and reserved with it: a leak, never cache_growth as well.
#[test]
fn a_leak_stays_a_leak() {
    for every in [1, 8] {
        let run = (0..3_000).map(|i| {
            let a = allocated(i, 3) + 20.0 * MIB * i as f64;
            // Reserved follows in segments, and fragmentation makes it run a little ahead.
            let r = a * 1.08 + 2.0 * GIB;
            (((r / (64.0 * MIB)).ceil()) * 64.0 * MIB, a)
        });
        let (found, leaked) = first_signal(run, every);
        assert!(found.is_none(), "every {every}: {found:?}");
        assert!(leaked, "every {every}: the leak detector saw it");
    }
}

/// The words: what it means, and the settings in use, escaped (they come from the trainer).
#[test]
fn the_message_says_what_it_means_and_the_hint_names_the_settings() {
    use crate::core::detect::message::{describe, hint};
    let run = (0..400).map(|i| (2.0 * GIB + 138.0 * MIB * i as f64, allocated(i, 1)));
    let (found, _) = first_signal(run, 1);
    let (_, sig) = found.expect("flagged");
    let m = describe(Kind::CacheGrowth, &sig.evidence);
    assert!(
        m.starts_with("reserved memory (PyTorch's cache) grows 138"),
        "{m}"
    );
    assert!(m.contains("while allocated stays at 1."), "{m}");
    assert!(m.contains("at this rate the GPU is full in"), "{m}");
    let h = hint(Kind::CacheGrowth, &sig.evidence).expect("a hint");
    assert!(
        h.starts_with(
            "PYTORCH_CUDA_ALLOC_CONF is \"max_split_size_mb:128,expandable_segments:True\""
        ),
        "{h}"
    );
    assert!(h.contains("#123548") && h.contains("empty_cache()"), "{h}");
    let odd = Evidence {
        alloc_conf: Some("a\u{1b}[2J\u{202e}b".into()),
        ..Evidence::default()
    };
    let h = hint(Kind::CacheGrowth, &odd).expect("a hint");
    assert!(!h.contains('\u{1b}') && !h.contains('\u{202e}'), "{h:?}");
    let none = hint(Kind::CacheGrowth, &Evidence::default()).expect("a hint");
    assert!(none.starts_with("check PYTORCH_CUDA_ALLOC_CONF"), "{none}");
}

/// CUDA graphs captured one after another through the warm-up and past it (a new shape every
/// ~70 steps): a staircase of pools that stops, not a creep.
#[test]
fn graphs_captured_through_the_warm_up_are_not_cache_growth() {
    for every in [1, 4, 8] {
        for seed in 0..4 {
            let stairs = [13, 82, 159, 225, 290];
            let run = (0..8_000).map(move |i| {
                let pools = stairs.iter().filter(|s| i >= **s).count() as f64;
                (
                    26.0 * GIB + pools * 2.2 * GIB + segment(i / 700, seed),
                    allocated(i, seed),
                )
            });
            let (found, _) = first_signal(run, every);
            assert!(found.is_none(), "every {every}, seed {seed}: {found:?}");
        }
    }
}

/// Variable lengths drift fragmentation up from 3% to 12% of the peak over thousands of steps:
/// reserved follows, 4 GiB in 64 MiB segments, then holds. A cache that settles, not a creep.
#[test]
fn fragmentation_drifting_up_for_thousands_of_steps_is_not_cache_growth() {
    for every in [1, 8] {
        for seed in 0..3 {
            let run = (0..12_000).map(move |i| {
                let drift = 4.0 * GIB * (i.min(4_000) as f64 / 4_000.0);
                let jitter = noise(i, seed) * 128.0 * MIB;
                let r = ((30.0 * GIB + drift + jitter) / (64.0 * MIB)).floor() * 64.0 * MIB;
                (r, allocated(i, seed))
            });
            let (found, _) = first_signal(run, every);
            assert!(found.is_none(), "every {every}, seed {seed}: {found:?}");
        }
    }
}
