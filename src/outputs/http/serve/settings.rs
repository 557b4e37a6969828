//! `[http]`: the server's limits as the config file writes them, checked here against the
//! server's own bounds (hyper's smallest head buffer among them).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::HttpLimits;
use crate::util::seconds::de_seconds;

/// Smallest request-head buffer, in bytes: hyper panics on a smaller read buffer.
pub const MIN_HEAD_BYTES: usize = 8192;

/// Limits of the HTTP server (/metrics and the API), so that slow, idle or oversized clients
/// are closed rather than held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Open HTTP connections at most; one more is closed as soon as it is accepted.
    pub connection_limit: usize,
    /// Seconds from connecting (or from the first byte of a later request) to a complete head.
    #[serde(deserialize_with = "de_seconds")]
    pub header_timeout_seconds: f64,
    /// Seconds a keep-alive connection may sit between requests.
    #[serde(deserialize_with = "de_seconds")]
    pub keepalive_timeout_seconds: f64,
    /// Request line plus headers, in bytes; a larger head is answered 431 and closed.
    pub max_request_head_bytes: usize,
    /// Seconds that requests in flight get to finish at shutdown; then every connection closes.
    #[serde(deserialize_with = "de_seconds")]
    pub shutdown_grace_seconds: f64,
    /// TLS, basic auth and response headers, in the exporter-toolkit's web config format.
    pub web_config_file: Option<PathBuf>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            // Far below the unit's LimitNOFILE=8192 less ingest's 1024, so ingest keeps its fds.
            connection_limit: 512,
            header_timeout_seconds: 10.0,
            keepalive_timeout_seconds: 60.0,
            max_request_head_bytes: 16 * 1024,
            shutdown_grace_seconds: 3.0,
            web_config_file: None,
        }
    }
}

/// An `[http]` value out of bounds, named by its key in the config file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid {key} = {value:?}: {reason}")]
pub struct InvalidHttp {
    pub key: &'static str,
    pub value: String,
    pub reason: String,
}

impl HttpConfig {
    pub fn validate(&self) -> Result<(), InvalidHttp> {
        let invalid = |key, value: String, reason: String| Err(InvalidHttp { key, value, reason });
        if !(1..=1_000_000).contains(&self.connection_limit) {
            return invalid(
                "http.connection_limit",
                self.connection_limit.to_string(),
                "keep between 1 and 1000000, and well under the open-file limit".into(),
            );
        }
        for (key, v, min, max) in [
            (
                "http.header_timeout_seconds",
                self.header_timeout_seconds,
                0.1,
                3_600.0,
            ),
            (
                "http.keepalive_timeout_seconds",
                self.keepalive_timeout_seconds,
                0.1,
                86_400.0,
            ),
            (
                "http.shutdown_grace_seconds",
                self.shutdown_grace_seconds,
                0.0,
                300.0,
            ),
        ] {
            // Written as a negated range so that NaN is refused too.
            if !(v >= min && v <= max) {
                return invalid(
                    key,
                    v.to_string(),
                    format!("keep between {min} and {max} seconds"),
                );
            }
        }
        let head = self.max_request_head_bytes;
        if !(MIN_HEAD_BYTES..=1 << 20).contains(&head) {
            return invalid(
                "http.max_request_head_bytes",
                head.to_string(),
                format!("keep between {MIN_HEAD_BYTES} and 1048576 bytes, e.g. 16384"),
            );
        }
        Ok(())
    }
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self::from(&HttpConfig::default())
    }
}

impl From<&HttpConfig> for HttpLimits {
    /// Seconds were range-checked by `HttpConfig::validate`; a config built in code without it
    /// falls back to a fixed value for one a Duration cannot hold.
    fn from(c: &HttpConfig) -> Self {
        let secs = |s: f64, default| Duration::try_from_secs_f64(s).unwrap_or(default);
        Self {
            max_connections: c.connection_limit.max(1),
            header_timeout: secs(c.header_timeout_seconds, Duration::from_secs(10)),
            idle_timeout: secs(c.keepalive_timeout_seconds, Duration::from_secs(60)),
            max_head_bytes: c.max_request_head_bytes.max(MIN_HEAD_BYTES),
            drain: secs(c.shutdown_grace_seconds, Duration::from_secs(3)),
        }
    }
}
