//! The config's checks on its own values, each error naming the key, the value and a fix.

use super::{Config, ConfigError, MAX_ENTRIES};

impl Config {
    pub(super) fn validate_ingest(&self) -> Result<(), ConfigError> {
        let i = &self.ingest;
        for (key, v, max) in [
            (
                "ingest.hello_timeout_seconds",
                i.hello_timeout_seconds,
                3_600.0,
            ),
            (
                "ingest.idle_timeout_seconds",
                i.idle_timeout_seconds,
                604_800.0,
            ),
        ] {
            // Written as a negated range so that NaN is refused too.
            if !(v >= 0.1 && v <= max) {
                return Err(ConfigError::Invalid {
                    key,
                    value: v.to_string(),
                    reason: format!("keep between 0.1 and {max} seconds"),
                });
            }
        }
        // At least one whole line must fit, past the 4 KiB every connection has.
        if !(128 * 1024..=1 << 30).contains(&i.max_line_buffer_bytes) {
            return Err(ConfigError::Invalid {
                key: "ingest.max_line_buffer_bytes",
                value: i.max_line_buffer_bytes.to_string(),
                reason: "set it between 131072 and 1073741824".into(),
            });
        }
        // A reserve of every slot would leave none for a connection to say its hello in.
        if i.reserved_connections >= i.max_connections {
            return Err(ConfigError::Invalid {
                key: "ingest.reserved_connections",
                value: i.reserved_connections.to_string(),
                reason: format!(
                    "must be below ingest.max_connections = {}: set it between 0 and {}, or raise max_connections",
                    i.max_connections,
                    i.max_connections.saturating_sub(1)
                ),
            });
        }
        Ok(())
    }

    pub(super) fn validate_attribution(&self) -> Result<(), ConfigError> {
        let a = &self.attribution;
        let invalid = |key, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                value,
                reason: reason.into(),
            })
        };
        if !(1..=1_000_000).contains(&a.window_steps) {
            return invalid(
                "attribution.window_steps",
                a.window_steps.to_string(),
                "keep between 1 and 1000000 steps, e.g. 200",
            );
        }
        if !(a.window_seconds >= 1.0 && a.window_seconds <= 86_400.0) {
            return invalid(
                "attribution.window_seconds",
                a.window_seconds.to_string(),
                "keep between 1 and 86400 seconds, e.g. 120.0",
            );
        }
        if !(1..=MAX_ENTRIES).contains(&a.max_entries) {
            return invalid(
                "attribution.max_entries",
                a.max_entries.to_string(),
                "keep between 1 and 100000: torch keeps that many allocation records, each with its stack, in the trainer's memory",
            );
        }
        if !(1..=crate::core::detect::attribution::MAX_SITES as u64).contains(&a.top) {
            return invalid(
                "attribution.top",
                a.top.to_string(),
                "keep between 1 and 20 sites",
            );
        }
        if !(a.cooldown_seconds >= 0.0 && a.cooldown_seconds <= 604_800.0) {
            return invalid(
                "attribution.cooldown_seconds",
                a.cooldown_seconds.to_string(),
                "keep between 0 and 604800 seconds (a week), e.g. 600.0",
            );
        }
        Ok(())
    }
}
