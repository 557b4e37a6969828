//! Hysteresis shared by every finding: a condition must hold for a streak of observations to
//! fire and be absent for one to resolve, so one noisy sample neither raises nor clears a
//! finding. A streak is counted in observations and, where a detector asks for it, must also
//! last a number of steps and seconds: samples come at the client's cadence (at most 10 a
//! second, every few steps on slow steps), so a count of samples alone is no measure of time.

use super::Pos;

/// How long a streak must last: `samples` observations in a row that also span at least `steps`
/// steps and `secs` seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub samples: u32,
    pub steps: u64,
    pub secs: f64,
}

impl Span {
    /// A streak of `n` observations, however long they take.
    pub const fn samples(n: u32) -> Self {
        Self {
            samples: n,
            steps: 0,
            secs: 0.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing to report.
    Quiet,
    /// Evidence building, not firing yet.
    Pending,
    /// Evidence gone before it fired.
    Dropped,
    Fired,
    /// Still firing (evidence refreshed).
    Firing,
    Resolved,
}

#[derive(Debug, Clone)]
pub struct Lifecycle {
    raise: Span,
    clear: Span,
    on: u32,
    off: u32,
    firing: bool,
    /// First observation of the current active streak: a raise span is measured from there.
    on_since: Option<Pos>,
    /// Last active observation: a clear span (the quiet period) is measured from there.
    last_on: Option<Pos>,
}

impl Lifecycle {
    pub fn new(raise: Span, clear: Span) -> Self {
        let at_least_one = |s: Span| Span {
            samples: s.samples.max(1),
            ..s
        };
        Self {
            raise: at_least_one(raise),
            clear: at_least_one(clear),
            on: 0,
            off: 0,
            firing: false,
            on_since: None,
            last_on: None,
        }
    }

    pub fn is_firing(&self) -> bool {
        self.firing
    }

    pub fn step(&mut self, active: bool, at: Pos) -> Change {
        if active {
            self.off = 0;
            self.on = self.on.saturating_add(1);
            let since = *self.on_since.get_or_insert(at);
            self.last_on = Some(at);
            if self.firing {
                Change::Firing
            } else if lasted(self.on, self.raise, since, at) {
                self.firing = true;
                Change::Fired
            } else {
                Change::Pending
            }
        } else {
            let was_pending = self.on > 0 && !self.firing;
            self.on = 0;
            self.on_since = None;
            self.off = self.off.saturating_add(1);
            if self.firing {
                let quiet_since = self.last_on.unwrap_or(at);
                if lasted(self.off, self.clear, quiet_since, at) {
                    self.firing = false;
                    Change::Resolved
                } else {
                    Change::Firing
                }
            } else if was_pending {
                Change::Dropped
            } else {
                Change::Quiet
            }
        }
    }
}

fn lasted(count: u32, span: Span, since: Pos, now: Pos) -> bool {
    count >= span.samples && since.reached(&now, span.steps, span.secs)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod span_tests;
