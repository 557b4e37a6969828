//! The one retry schedule: start at a floor, double after each failure up to a cap, back to the
//! floor after a success. The NVML poller, the alert sinks, the kubelet client and the TUI's
//! daemon fetcher all wait this way.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    floor: Duration,
    cap: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(floor: Duration, cap: Duration) -> Self {
        let cap = cap.max(floor);
        Self {
            floor,
            cap,
            current: floor,
        }
    }

    /// The wait before the next attempt, after a failure: the current wait, which then doubles
    /// (up to the cap).
    pub fn fail(&mut self) -> Duration {
        let wait = self.current;
        self.current = (self.current * 2).min(self.cap);
        wait
    }

    /// After a success: the next failure waits the floor again.
    pub fn reset(&mut self) {
        self.current = self.floor;
    }

    /// What `fail` would return now.
    pub fn current(&self) -> Duration {
        self.current
    }
}

#[cfg(test)]
mod tests;
