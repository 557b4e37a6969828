use super::*;

#[test]
fn gpus_never_overcommit_and_the_leak_restarts_before_the_limit() {
    let p = Profile::Leak.period().unwrap();
    assert!(p > 600.0 && p < 1800.0, "period {p}");
    for i in 0..4000 {
        let t = i as f64 * 0.5;
        for gpu in 0..2 {
            assert!(singles_free(gpu, t) > 0, "gpu {gpu} full at {t}");
        }
        let (_, s) = Profile::Leak.at(t);
        assert!(s.allocated_peak.unwrap() < s.reserved.unwrap());
    }
}

#[test]
fn the_untracked_trainer_grows_outside_a_flat_allocator_then_holds() {
    let p = Profile::Untracked;
    let outside = |t: f64| {
        let (_, s) = p.at(t);
        p.nvml_used(t) - s.reserved.unwrap()
    };
    assert_eq!(outside(10.0), CONTEXT as u64, "warm-up: the context alone");
    assert_eq!(outside(140.0) - outside(100.0), (200.0 * 4.0 * MIB) as u64);
    // All 3 GiB by the leak's first OOM, which is what its limit counts on.
    let oom = Profile::Leak.oom_after(0.0).unwrap();
    assert_eq!(outside(oom), (CONTEXT + UNTRACKED_GROWTH) as u64);
    assert_eq!(p.oom_after(5.0), None);
}

#[test]
fn each_run_ends_at_the_next_boundary() {
    let p = Profile::Leak.period().unwrap();
    assert_eq!(Profile::Leak.oom_after(0.0), Some(p));
    assert_eq!(Profile::Leak.oom_after(p - 1.0), Some(p));
    // A restart at the boundary itself lives a whole period, rounding or not.
    let next = Profile::Leak.oom_after(p).unwrap();
    assert!((next - 2.0 * p).abs() < 1e-6, "{next}");
    assert_eq!(Profile::Healthy.oom_after(5.0), None);
    // The run's last step is its last: the step counter starts over after the boundary.
    let (last, _) = Profile::Leak.at(p - 1e-6);
    let (first, _) = Profile::Leak.at(p + 1e-6);
    assert_eq!((last, first), ((p * STEPS_PER_SECOND) as u64, 0));
}

#[test]
fn the_near_limit_split_adds_up_to_its_peak_at_either_batch() {
    for step in [3, 248, 249, 250] {
        let (_, stats) = Profile::NearLimit.at(step as f64 / STEPS_PER_SECOND);
        let c = Profile::NearLimit.split(step).unwrap();
        let peak = stats.allocated_peak.unwrap();
        // What the split names fits in the step's peak; the floor holds the fixed part.
        assert!(c.named_bytes() < peak, "step {step}");
        assert!(c.fixed_bytes() < stats.allocated.unwrap(), "step {step}");
        assert!(peak < stats.reserved.unwrap(), "step {step}");
        let short = step == 249;
        assert_eq!(
            c.batch_size,
            Some(if short { 10 } else { 16 }),
            "step {step}"
        );
    }
    assert_eq!(Profile::Healthy.split(3), None);
}

#[test]
fn the_split_is_measured_at_step_3_every_300_s_and_once_at_a_short_batch() {
    let measured = |from: u64| {
        let mut c = SplitCadence::default();
        (from..from + 3200)
            .filter(|s| c.at(Profile::NearLimit, *s).is_some())
            .collect::<Vec<_>>()
    };
    assert_eq!(measured(0), [3, 249, 250, 1750]);
    // Started at a short batch (--skip): the first split is a full one.
    assert_eq!(measured(499), [500, 749, 750, 2250]);
    let mut c = SplitCadence::default();
    assert!((0..100).all(|s| c.at(Profile::Leak, s).is_none()));
}

/// What the daemon makes of the demo's splits: a batch of 14 fits (the trainer runs 16, near its
/// limit), scaled in proportion from the first split, fitted once the short batch was seen.
#[test]
fn the_daemon_fits_14_proportional_then_fitted() {
    use crate::core::categories::{Budget, FitBasis, Tracker};
    let mut tracker = Tracker::default();
    let mut fits = Vec::new();
    for step in [3, 249, 250] {
        let t = step as f64 / STEPS_PER_SECOND;
        let (_, stats) = Profile::NearLimit.at(t);
        tracker.take(
            Profile::NearLimit.split(step).unwrap(),
            t,
            stats.allocated_peak,
        );
        // As the daemon's limit: what the allocator has plus what the device has free.
        let limit = crate::frontends::demo::job::device_free(1, t) + stats.reserved.unwrap();
        let fit = tracker
            .fit(Budget {
                limit: Some(limit),
                cap: None,
                inactive_split: stats.inactive_split,
            })
            .unwrap();
        fits.push((fit.basis, fit.largest_safe_batch));
    }
    assert_eq!(
        fits,
        [
            (FitBasis::Proportional, 14),
            (FitBasis::Fitted, 14),
            (FitBasis::Fitted, 14)
        ]
    );
}
