//! Configuration: defaults < TOML file < `GPUMON_*` environment < flags.
//!
//! The file is strict (unknown keys are errors that name the key) because a typo in a monitoring
//! config otherwise fails silently, and you find out when the alert you configured never fires.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::outputs::http::serve::{HttpConfig, InvalidHttp};
use crate::outputs::record::{InvalidRecord, RecordConfig};
use crate::sources::kubelet::{InvalidKubernetes, KubernetesConfig};
use crate::util::seconds::de_seconds;

/// Where the daemon looks for its config when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpumon/gpumon.toml";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// HTTP address for /metrics, the JSON API and health checks.
    pub listen: SocketAddr,
    /// Ingest socket path; unset means the protocol's default rules.
    pub socket: Option<PathBuf>,
    /// NVML library to load at run time.
    pub nvml_lib: String,
    /// Where the host's /proc is mounted (e.g. /host/proc when gpumon runs in a container).
    pub procfs: PathBuf,
    /// The name this node goes by in the API, alerts and recorded traces; the kernel's
    /// hostname when unset.
    pub node_name: Option<String>,
    /// How often NVML is polled.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub interval: Duration,
    pub log_format: LogFormat,
    /// tracing filter, e.g. "info" or "gpumon=debug,gpumon_core=debug" (the domain core logs
    /// under its own crate).
    pub log_level: String,
    pub history: HistoryConfig,
    pub ingest: IngestConfig,
    pub http: HttpConfig,
    pub record: RecordConfig,
    pub detect: DetectSection,
    pub attribution: AttributionSection,
    pub oom: oom::OomSection,
    pub alerts: AlertsConfig,
    pub kubernetes: KubernetesConfig,
}

/// Leak attribution: asking a trainer (one whose client announced it can) where the growing
/// memory is allocated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttributionSection {
    pub enabled: bool,
    /// A window lasts at most this many steps (fewer for a fast leak)...
    pub window_steps: u64,
    /// ...or this many seconds, whichever comes first.
    #[serde(deserialize_with = "de_seconds")]
    pub window_seconds: f64,
    /// Allocation records the trainer keeps while it records.
    pub max_entries: u64,
    /// Sites reported at most.
    pub top: u64,
    /// Seconds between two requests to one trainer, at least.
    #[serde(deserialize_with = "de_seconds")]
    pub cooldown_seconds: f64,
}

impl Default for AttributionSection {
    fn default() -> Self {
        let d = crate::core::store::sessions::AttributionPolicy::default();
        Self {
            enabled: d.enabled,
            window_steps: d.window_steps,
            window_seconds: d.window_seconds,
            max_entries: d.max_entries,
            top: d.top,
            cooldown_seconds: d.cooldown_seconds,
        }
    }
}

/// Most allocation records a window may ask torch to keep.
const MAX_ENTRIES: u64 = 100_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// Alertmanager base URL (e.g. http://127.0.0.1:9093); findings are posted to /api/v2/alerts.
    pub alertmanager_url: Option<String>,
    /// A URL that receives findings as JSON (POST).
    pub webhook_url: Option<String>,
    /// How often firing findings are sent to Alertmanager again.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub resend_interval: Duration,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        Self {
            alertmanager_url: None,
            webhook_url: None,
            resend_interval: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DetectSection {
    /// near_limit fires when headroom at the step peak stays under this many bytes (under an
    /// allocator cap, under a tenth of the cap when that is less).
    pub headroom_margin_bytes: u64,
    /// A leak is reported once the floor's growth reaches this share of the device memory.
    pub leak_materiality_ratio: f64,
    /// How long a crash finding stays firing after its trainer died.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub crash_hold: Duration,
    /// How long after a job's first failure another rank's failure counts as its consequence.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub job_cascade: Duration,
    /// How long NVML must keep listing memory of an exited process before orphaned_memory fires.
    #[serde(deserialize_with = "de_duration", serialize_with = "ser_duration")]
    pub orphan_grace: Duration,
}

impl Default for DetectSection {
    fn default() -> Self {
        let d = crate::core::detect::DetectConfig::default();
        Self {
            headroom_margin_bytes: d.headroom_margin_bytes,
            leak_materiality_ratio: d.leak_materiality_ratio,
            crash_hold: Duration::from_secs_f64(d.crash_hold_seconds),
            job_cascade: Duration::from_secs_f64(d.job_cascade_seconds),
            orphan_grace: Duration::from_secs_f64(d.orphan_grace_seconds),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// Open trainer connections at most; one more is refused with `too_many_connections`.
    pub max_connections: usize,
    /// Lines per second a connection may send (bursts of twice that); past it the connection
    /// is closed with `rate_limited`. Trainers send one line per step.
    pub max_lines_per_second: u32,
    /// A connection that has not sent its hello this long after connecting is closed.
    #[serde(deserialize_with = "de_seconds")]
    pub hello_timeout_seconds: f64,
    /// A connection that sends nothing this long after its hello is closed. A trainer stepping
    /// once a minute sends a line a minute, far inside the default.
    #[serde(deserialize_with = "de_seconds")]
    pub idle_timeout_seconds: f64,
    /// Open connections one local user (uid) may hold, so one user cannot take every slot.
    pub max_connections_per_uid: usize,
    /// Slots of `max_connections` that connections without a hello may never take, so a
    /// trainer's hello always finds room.
    pub reserved_connections: usize,
    /// Bytes all connections together may buffer past their first 4 KiB (bursts, and lines up
    /// to the 64 KiB cap); a connection sitting on a long line unfinished gives way to others.
    pub max_line_buffer_bytes: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_lines_per_second: 1000,
            hello_timeout_seconds: 10.0,
            idle_timeout_seconds: 900.0,
            max_connections_per_uid: 256,
            reserved_connections: 32,
            max_line_buffer_bytes: 16 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Points kept per GPU (one per poll): 3600 is an hour at 1 s.
    pub gpu_points: usize,
    /// No longer used: nothing read per-process history, so none is kept. Accepted so that
    /// older config files still load; the daemon warns when it is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_points: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9477)),
            socket: None,
            nvml_lib: "libnvidia-ml.so.1".into(),
            procfs: "/proc".into(),
            node_name: None,
            interval: Duration::from_secs(1),
            log_format: LogFormat::Text,
            log_level: "info".into(),
            history: HistoryConfig::default(),
            ingest: IngestConfig::default(),
            http: HttpConfig::default(),
            record: RecordConfig::default(),
            detect: DetectSection::default(),
            attribution: AttributionSection::default(),
            oom: oom::OomSection::default(),
            alerts: AlertsConfig::default(),
            kubernetes: KubernetesConfig::default(),
        }
    }
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            gpu_points: 3600,
            process_points: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid {key} = {value:?}: {reason}")]
    Invalid {
        key: &'static str,
        value: String,
        reason: String,
    },
    #[error("{var} is set: {reason}")]
    Env {
        var: String,
        key: String,
        reason: String,
    },
}

/// The parts' own settings errors read as config's: each already names its key and value.
macro_rules! invalid_from {
    ($($part:ty),*) => {$(
        impl From<$part> for ConfigError {
            fn from(e: $part) -> Self {
                Self::Invalid {
                    key: e.key,
                    value: e.value,
                    reason: e.reason,
                }
            }
        }
    )*};
}
invalid_from!(InvalidHttp, InvalidKubernetes, InvalidRecord);

impl ConfigError {
    /// The exit status for a configuration error: EX_CONFIG from sysexits.h. The systemd unit
    /// lists it in RestartPreventExitStatus=, since restarting cannot fix the config.
    pub const EXIT_CODE: u8 = 78;
}

impl Config {
    pub fn detect(&self) -> crate::core::detect::DetectConfig {
        crate::core::detect::DetectConfig {
            headroom_margin_bytes: self.detect.headroom_margin_bytes,
            leak_materiality_ratio: self.detect.leak_materiality_ratio,
            crash_hold_seconds: self.detect.crash_hold.as_secs_f64(),
            job_cascade_seconds: self.detect.job_cascade.as_secs_f64(),
            orphan_grace_seconds: self.detect.orphan_grace.as_secs_f64(),
        }
    }

    pub fn attribution(&self) -> crate::core::store::sessions::AttributionPolicy {
        let a = &self.attribution;
        crate::core::store::sessions::AttributionPolicy {
            enabled: a.enabled,
            window_steps: a.window_steps,
            window_seconds: a.window_seconds,
            max_entries: a.max_entries,
            top: a.top,
            cooldown_seconds: a.cooldown_seconds,
        }
    }

    /// What `gpumon status` and the TUI need of the config: this machine's daemon and NVML.
    pub fn machine(&self) -> crate::frontends::local::Machine {
        crate::frontends::local::Machine {
            listen: self.listen,
            nvml_lib: self.nvml_lib.clone(),
            procfs: self.procfs.clone(),
            interval: self.interval,
        }
    }

    /// The `[oom]` settings: arming trainers before an OOM.
    pub fn oom(&self) -> crate::core::store::sessions::OomPolicy {
        self.oom.policy()
    }

    /// Loads the file at `path`, or the default path when it exists, or the defaults.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let ms = self.interval.as_millis();
        if !(10..=3_600_000).contains(&ms) {
            return Err(ConfigError::Invalid {
                key: "interval",
                value: humantime::format_duration(self.interval).to_string(),
                reason: "use a poll interval between 10ms and 1h, e.g. \"1s\"".into(),
            });
        }
        if let Some(n) = &self.node_name {
            // It labels alerts and names hosts in a terminal: a short printable word.
            if n.is_empty() || n.len() > 128 || n.chars().any(char::is_control) {
                return Err(ConfigError::Invalid {
                    key: "node_name",
                    value: format!("{n:?}"),
                    reason: "use 1 to 128 printable characters, e.g. the node's short hostname"
                        .into(),
                });
            }
        }
        if let Some(reason) = log_filter::problem(&self.log_level) {
            return Err(ConfigError::Invalid {
                key: "log_level",
                value: self.log_level.clone(),
                reason,
            });
        }
        for (key, n) in [
            ("history.gpu_points", self.history.gpu_points),
            ("ingest.max_connections", self.ingest.max_connections),
            (
                "ingest.max_lines_per_second",
                self.ingest.max_lines_per_second as usize,
            ),
            (
                "ingest.max_connections_per_uid",
                self.ingest.max_connections_per_uid,
            ),
        ] {
            if !(1..=1_000_000).contains(&n) {
                return Err(ConfigError::Invalid {
                    key,
                    value: n.to_string(),
                    reason: "keep between 1 and 1000000".into(),
                });
            }
        }
        for (key, url) in [
            ("alerts.alertmanager_url", &self.alerts.alertmanager_url),
            ("alerts.webhook_url", &self.alerts.webhook_url),
        ] {
            if let Some(u) = url {
                if !(u.starts_with("http://") || u.starts_with("https://")) {
                    return Err(ConfigError::Invalid {
                        key,
                        value: u.clone(),
                        reason: "use an http:// or https:// URL".into(),
                    });
                }
            }
        }
        let ratio = self.detect.leak_materiality_ratio;
        if !(ratio > 0.0 && ratio < 1.0) {
            return Err(ConfigError::Invalid {
                key: "detect.leak_materiality_ratio",
                value: ratio.to_string(),
                reason: "use a share of device memory between 0 and 1, e.g. 0.005".into(),
            });
        }
        self.validate_attribution()?;
        self.oom.validate()?;
        self.validate_ingest()?;
        self.http.validate()?;
        self.kubernetes.validate()?;
        self.record.validate()?;
        Ok(())
    }
}

/// Parses "1s", "500ms", "2m" as clap and serde both need it.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration ({e}); write it like \"1s\" or \"500ms\""))
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

fn ser_duration<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*v).to_string())
}

pub mod env;
mod example;
mod log_filter;
mod validate;

pub use example::example;
pub mod oom;

#[cfg(test)]
mod tests;
