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
