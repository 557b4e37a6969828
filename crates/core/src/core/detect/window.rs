//! A detector's recent past, measured in steps and seconds rather than in samples: how many
//! samples a window holds depends on the client's cadence (at most 10 a second, and only every
//! few steps when steps are slow), while what a window means ("the last 300 steps") does not.

use std::collections::VecDeque;

use super::Pos;

/// Entries kept at most, whatever the cadence: a client sending far faster than the reference
/// one must not grow a window without bound. The oldest go first.
const MAX_ENTRIES: usize = 512;

#[derive(Debug, Clone)]
pub struct Recent<T> {
    /// An entry stays while it is within `steps` steps or within `secs` seconds of the newest.
    steps: u64,
    secs: f64,
    /// And the last `keep` entries stay whatever their age, so sparse samples still form a window.
    keep: usize,
    items: VecDeque<(Pos, T)>,
    /// The entries' values added up, kept as they come and go: a window can hold 512 entries,
    /// and summing them per sample was most of what a sample cost the detectors.
    total: u64,
}

impl<T: Copy + Into<u64>> Recent<T> {
    pub fn new(steps: u64, secs: f64, keep: usize) -> Self {
        Self {
            steps,
            secs,
            keep,
            items: VecDeque::new(),
            total: 0,
        }
    }

    /// Adds an entry at `at` and forgets those that fell out of the window.
    pub fn push(&mut self, at: Pos, v: T) {
        if self.items.len() == MAX_ENTRIES {
            self.pop();
        }
        self.items.push_back((at, v));
        // Wrapping both ways, so the total is exact whenever the true sum fits.
        self.total = self.total.wrapping_add(v.into());
        self.forget(at);
    }

    fn pop(&mut self) {
        if let Some((_, v)) = self.items.pop_front() {
            self.total = self.total.wrapping_sub(v.into());
        }
    }

    /// Forgets entries that are out of the window as seen from `now`.
    pub fn forget(&mut self, now: Pos) {
        while self.items.len() > self.keep {
            let Some((first, _)) = self.items.front() else {
                break;
            };
            if first.reached(&now, self.steps, self.secs) {
                self.pop();
            } else {
                break;
            }
        }
    }

    /// The values in the window added up (for `bool`, how many are true).
    pub fn total(&self) -> u64 {
        self.total
    }

    #[cfg(test)]
    fn values(&self) -> impl Iterator<Item = &T> {
        self.items.iter().map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// A session's step axis, continued across a step count that starts over (a per-epoch `step`, a
/// trainer that restarts its loop counter): a step lower than the last one is taken as the step
/// after it, and the steps that follow count on from there. The memory that survives each step
/// does not care that the counter started again, so neither do rates per step, windows in steps
/// and quiet periods; read as a jump back, each reset ran windows backwards and made findings
/// resolve and fire again.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepAxis {
    /// Added to the trainer's step: grows at each reset.
    offset: u64,
    last: Option<u64>,
}

impl StepAxis {
    /// The step on the continued axis; None for a sample without a step (a timer sample).
    pub fn at(&mut self, raw: Option<u64>) -> Option<u64> {
        let raw = raw?;
        let mut step = raw.saturating_add(self.offset);
        if let Some(last) = self.last.filter(|last| step < *last) {
            // A repeated step stays where it is; one going back continues after the last.
            step = last.saturating_add(1);
            self.offset = step - raw;
        }
        self.last = Some(step);
        Some(step)
    }

    /// Whether the trainer's steps and the axis differ (a reset was seen).
    pub fn shifted(&self) -> bool {
        self.offset != 0
    }
}

#[cfg(test)]
mod tests {
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
}
