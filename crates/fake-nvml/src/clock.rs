//! Scenario time: seconds since scenario time 0, or a pinned value.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

pub const ENV_T0: &str = "FAKE_NVML_T0";
pub const ENV_TIME: &str = "FAKE_NVML_TIME";

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pinned: Option<f64>,
    t0_unix: f64,
}

/// Unix time of the first successful `nvmlInit*` in this process: the default time 0, kept
/// across shutdown/init cycles so a re-initializing reader sees one continuous timeline.
static FIRST_INIT: OnceLock<f64> = OnceLock::new();

fn unix_now() -> f64 {
    // A clock before 1970 is not worth failing over; treat it as time 0.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn env_seconds(name: &str) -> Result<Option<f64>, String> {
    match std::env::var(name) {
        Ok(s) => match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(Some(v)),
            _ => Err(format!("{name}={s:?} is not a number of seconds")),
        },
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

impl Clock {
    /// Reads `FAKE_NVML_TIME` and `FAKE_NVML_T0`; called when the library initializes.
    pub fn from_env() -> Result<Clock, String> {
        let pinned = env_seconds(ENV_TIME)?;
        let t0_unix = match env_seconds(ENV_T0)? {
            Some(t0) => t0,
            None => *FIRST_INIT.get_or_init(unix_now),
        };
        Ok(Clock { pinned, t0_unix })
    }

    pub fn pinned(t: f64) -> Clock {
        Clock {
            pinned: Some(t),
            t0_unix: 0.0,
        }
    }

    /// Current scenario time in seconds.
    pub fn now(&self) -> f64 {
        self.pinned.unwrap_or_else(|| unix_now() - self.t0_unix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_clock_does_not_move() {
        let c = Clock::pinned(3.5);
        assert_eq!(c.now(), 3.5);
    }
}
