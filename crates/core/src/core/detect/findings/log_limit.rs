//! A budget for log lines of one kind (findings, trainer sessions): a burst per interval, then
//! one summary line with the count of what was left out. A flood of crashing sessions would
//! otherwise write a line or two per session: 200,000 lines for 100,000 sessions.

use crate::core::model::Timestamp;

/// Lines allowed per interval.
const BURST: u32 = 20;
/// Seconds per interval.
const INTERVAL: f64 = 10.0;

#[derive(Debug, Default)]
pub struct LogLimit {
    /// What the lines are about, for the summary line ("finding", "trainer session").
    what: &'static str,
    start: Timestamp,
    used: u32,
    /// Left out in the current interval, told in its summary line.
    held_back: u64,
    /// Left out since start.
    suppressed: u64,
}

impl LogLimit {
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            ..Self::default()
        }
    }

    /// Whether a line at `now` may be written; counts it as suppressed when not.
    pub fn allow(&mut self, now: Timestamp) -> bool {
        self.roll(now);
        if self.used < BURST {
            self.used += 1;
            true
        } else {
            self.held_back += 1;
            self.suppressed += 1;
            false
        }
    }

    /// Starts a new interval when the current one is over (or time went back), saying first
    /// how many lines it left out.
    pub fn roll(&mut self, now: Timestamp) {
        if now >= self.start && now - self.start < INTERVAL {
            return;
        }
        if self.held_back > 0 {
            tracing::warn!(
                suppressed = self.held_back,
                seconds = INTERVAL,
                total = self.suppressed,
                "{} log lines suppressed (more than {BURST} in {INTERVAL} s); \
                 gpumon_log_suppressed_total counts them",
                self.what
            );
        }
        self.start = now;
        self.used = 0;
        self.held_back = 0;
    }

    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests;
