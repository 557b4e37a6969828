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
mod tests;
