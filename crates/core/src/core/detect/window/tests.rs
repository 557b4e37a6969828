use super::*;

use crate::core::detect::pos_at as at;

#[test]
fn an_entry_stays_while_within_the_steps_or_the_seconds() {
    let mut w = Recent::new(100, 60.0, 0);
    w.push(at(0, 0.0), 1u64);
    // 150 steps later but only 30 s: still within the time bound.
    w.push(at(150, 30.0), 2);
    assert_eq!(w.len(), 2);
    // 50 steps but 90 s on from the first: within the step bound.
    let mut slow = Recent::new(100, 60.0, 0);
    slow.push(at(0, 0.0), 1u64);
    slow.push(at(50, 90.0), 2);
    assert_eq!(slow.len(), 2);
    // Past both: gone.
    w.push(at(200, 61.0), 3);
    assert_eq!(w.values().copied().collect::<Vec<_>>(), [2, 3]);
}

#[test]
fn the_last_entries_stay_however_sparse() {
    let mut w = Recent::new(20, 10.0, 3);
    for i in 0..6u64 {
        w.push(at(i * 100, i as f64 * 500.0), i);
    }
    assert_eq!(w.values().copied().collect::<Vec<_>>(), [3, 4, 5]);
}

#[test]
fn timer_samples_without_steps_age_by_time() {
    let mut w = Recent::new(100, 60.0, 0);
    w.push(
        Pos {
            step: None,
            ts: 0.0,
        },
        1u64,
    );
    w.push(at(1, 30.0), 2);
    assert_eq!(w.len(), 2);
    w.push(at(2, 61.0), 3);
    assert_eq!(w.values().copied().collect::<Vec<_>>(), [2, 3]);
}

#[test]
fn a_step_count_that_starts_over_ages_by_time() {
    let mut w = Recent::new(100, 60.0, 0);
    w.push(at(5_000, 0.0), 1u64);
    w.push(at(3, 61.0), 2);
    assert_eq!(w.values().copied().collect::<Vec<_>>(), [2]);
}

/// The running total is the sum of what the window holds, through entries aging out, the
/// entry cap, and `forget` without a push.
#[test]
fn the_total_is_what_the_window_holds() {
    let mut w = Recent::new(20, 10.0, 3);
    let mut flags = Recent::new(20, 10.0, 0);
    for i in 0..2_000u64 {
        // Bursts of many samples at one step and time, then a jump: every way out is taken.
        let (step, ts) = if i % 700 < 600 {
            (i / 100, 1.0)
        } else {
            (i, i as f64)
        };
        w.push(at(step, ts), i % 7);
        flags.push(at(step, ts), i % 3 == 0);
        assert_eq!(w.total(), w.values().sum::<u64>(), "at {i}");
        let trues = flags.values().filter(|f| **f).count() as u64;
        assert_eq!(flags.total(), trues, "at {i}");
        assert!(w.len() <= MAX_ENTRIES);
    }
    flags.forget(at(1_000_000, 1e9));
    assert_eq!((flags.total(), flags.len()), (0, 0));
}

#[test]
fn a_step_count_that_starts_over_continues_the_axis() {
    let mut axis = StepAxis::default();
    let raw = [
        Some(0),
        Some(5),
        Some(5),
        Some(199),
        Some(0),
        None,
        Some(3),
        Some(1),
    ];
    let got: Vec<_> = raw.iter().map(|s| axis.at(*s)).collect();
    let want = [
        Some(0),
        Some(5),
        Some(5),
        Some(199),
        Some(200),
        None,
        Some(203),
        Some(204),
    ];
    assert_eq!(got, want);
    assert!(axis.shifted());
    let mut plain = StepAxis::default();
    assert_eq!(plain.at(Some(u64::MAX)), Some(u64::MAX));
    assert_eq!(plain.at(Some(7)), Some(u64::MAX), "saturates, never wraps");
}

#[test]
fn a_flood_of_entries_stays_bounded() {
    let mut w = Recent::new(u64::MAX, f64::INFINITY, 0);
    for i in 0..10_000u64 {
        w.push(at(i, 0.0), i);
    }
    assert_eq!(w.len(), MAX_ENTRIES);
}
