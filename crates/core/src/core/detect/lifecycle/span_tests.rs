use super::*;

use crate::core::detect::pos_at as at;

/// The quiet period is steps and seconds since the last active observation, however many
/// samples arrive in it: dense samples do not resolve early, sparse ones not late.
#[test]
fn a_quiet_period_is_measured_in_steps_and_seconds() {
    let quiet = Span {
        samples: 3,
        steps: 200,
        secs: 300.0,
    };
    // Dense: 10 samples a second, one per step. 1,000 quiet samples are only 100 s.
    let mut l = Lifecycle::new(Span::samples(1), quiet);
    assert_eq!(l.step(true, at(0, 0.0)), Change::Fired);
    for i in 1..=2999u64 {
        assert_eq!(l.step(false, at(i, i as f64 / 10.0)), Change::Firing, "{i}");
    }
    assert_eq!(l.step(false, at(3000, 300.0)), Change::Resolved);

    // Sparse: one sample every 50 steps of 5 s. Three quiet samples are 150 steps: not yet.
    let mut l = Lifecycle::new(Span::samples(1), quiet);
    l.step(true, at(0, 0.0));
    for k in 1..=3u64 {
        assert_eq!(l.step(false, at(k * 50, k as f64 * 250.0)), Change::Firing);
    }
    assert_eq!(l.step(false, at(200, 1000.0)), Change::Resolved);
}

#[test]
fn activity_inside_the_quiet_period_restarts_it() {
    let quiet = Span {
        samples: 1,
        steps: 100,
        secs: 0.0,
    };
    let mut l = Lifecycle::new(Span::samples(1), quiet);
    l.step(true, at(0, 0.0));
    assert_eq!(l.step(false, at(90, 9.0)), Change::Firing);
    assert_eq!(l.step(true, at(95, 9.5)), Change::Firing);
    assert_eq!(l.step(false, at(150, 15.0)), Change::Firing);
    assert_eq!(l.step(false, at(195, 19.5)), Change::Resolved);
}

#[test]
fn a_raise_span_needs_the_condition_to_last() {
    let raise = Span {
        samples: 3,
        steps: 50,
        secs: 30.0,
    };
    let mut l = Lifecycle::new(raise, Span::samples(1));
    // Three samples within a second are not 50 steps and 30 s.
    for i in 0..3u64 {
        assert_eq!(l.step(true, at(i, i as f64 * 0.1)), Change::Pending);
    }
    assert_eq!(l.step(true, at(40, 40.0)), Change::Pending);
    assert_eq!(l.step(true, at(50, 41.0)), Change::Fired);
}
