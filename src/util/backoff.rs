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
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets_to_the_floor() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let waits: Vec<u64> = (0..6).map(|_| b.fail().as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        b.reset();
        assert_eq!(b.fail(), Duration::from_secs(1));
        assert_eq!(b.current(), Duration::from_secs(2));
    }

    #[test]
    fn a_cap_below_the_floor_is_the_floor() {
        let mut b = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(b.fail(), Duration::from_secs(5));
        assert_eq!(b.fail(), Duration::from_secs(5));
    }
}
