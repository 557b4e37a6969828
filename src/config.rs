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
}

impl Default for DetectSection {
    fn default() -> Self {
        let d = crate::core::detect::DetectConfig::default();
        Self {
            headroom_margin_bytes: d.headroom_margin_bytes,
            leak_materiality_ratio: d.leak_materiality_ratio,
            crash_hold: Duration::from_secs_f64(d.crash_hold_seconds),
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

impl Config {
    fn validate_ingest(&self) -> Result<(), ConfigError> {
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

    fn validate_attribution(&self) -> Result<(), ConfigError> {
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

/// The commented example config that `gpumon config` prints and the repo ships as
/// `gpumon.example.toml`. Values come from `Config::default()`, so they cannot drift.
pub fn example() -> String {
    let d = Config::default();
    format!(
        r#"# gpumon configuration. Precedence: this file < GPUMON_* environment < command-line flags.
# Default location: {DEFAULT_CONFIG_PATH}. Unknown keys are an error, and so is a GPUMON_*
# variable for a key that has no variable (those below without one are read only from here).

# HTTP address for /metrics, /api/v1/snapshot, /healthz and /readyz.  (GPUMON_LISTEN, --listen)
listen = "{listen}"

# Trainer ingest socket. Unset: /run/gpumon/ingest.sock as root, else
# $XDG_RUNTIME_DIR/gpumon/ingest.sock (the gpumon directory is created). A path set here must be
# in an existing directory. Removed when the daemon stops.  (GPUMON_SOCKET, --socket)
# socket = "/run/gpumon/ingest.sock"

# The NVML library, loaded at run time; a path or a name the dynamic loader finds.
# (GPUMON_NVML_LIB, --nvml-lib)
nvml_lib = "{nvml_lib}"

# The host's /proc, read for process names, users and containers. In a container, mount the
# host's /proc (e.g. at /host/proc) and point this at it.  (GPUMON_PROCFS, --procfs)
procfs = "{procfs}"

# How often NVML is polled; a scrape never calls NVML itself.  (GPUMON_INTERVAL, --interval)
interval = "{interval}"

# Log output: "text" or "json".  (GPUMON_LOG_FORMAT, --log-format)
log_format = "{log_format}"

# Log filter: a level (trace, debug, info, warn, error, off) or directives like
# "info,gpumon::sources::ingest=debug"; a word that is not a level is an error.  (GPUMON_LOG_LEVEL, --log-level)
log_level = "{log_level}"

[history]
# Points kept per GPU, one per poll ({gpu_points} = an hour at 1s).
gpu_points = {gpu_points}

[ingest]
# Open trainer connections at most; past it a connection gets `too_many_connections`.
max_connections = {max_connections}
# Lines per second per connection (bursts of twice that); past it lines are dropped and the
# connection stays open, told how many with `rate_limited` (at most once a second). A trainer
# sends one line per optimizer step.
max_lines_per_second = {max_lines_per_second}
# Seconds a new connection has to send its hello before it is closed.
hello_timeout_seconds = {hello_timeout_seconds:?}
# Seconds a connection may send nothing after its hello before it is closed (a trainer sends a
# line per step, so one stepping once a minute never trips it).
idle_timeout_seconds = {idle_timeout_seconds:?}
# Open connections one user (uid) may hold, so that one user cannot take every slot.
max_connections_per_uid = {max_connections_per_uid}
# Slots of max_connections that connections without a hello may never take, so a trainer's
# hello always finds room (connections still waiting for theirs make way for newcomers).
reserved_connections = {reserved_connections}
# Bytes all connections together may buffer past their first 4 KiB (the 16 KiB reads of a burst,
# lines up to the 64 KiB cap). Past it a connection needing more waits, and one that has sat on
# an unfinished line for a second is closed (line_stalled) to make room.
max_line_buffer_bytes = {max_line_buffer_bytes}

[http]
# HTTP connections open at most (scrapers, the TUI, the API); one more is closed at once and
# counted. Keep it well under the open-file limit so the ingest socket always has room.
connection_limit = {connection_limit}
# Seconds a client has, from connecting (or from the first byte of a later request on the same
# connection), to send a complete request head; then it is closed (reason header_timeout).
header_timeout_seconds = {header_timeout_seconds:?}
# Seconds a keep-alive connection may sit between requests before it is closed.
keepalive_timeout_seconds = {keepalive_timeout_seconds:?}
# Request line plus headers, in bytes (at least 8192); a larger head is answered 431 and closed.
max_request_head_bytes = {max_request_head_bytes}
# At shutdown, seconds that requests in flight get to finish; then every connection is closed.
shutdown_grace_seconds = {shutdown_grace_seconds:?}
# TLS, basic auth and response headers for /metrics and the API, in the web config format of
# Prometheus' exporter-toolkit (the file node_exporter's --web.config.file reads). Reloaded when
# it changes and on SIGHUP. Unset: plain HTTP.  (GPUMON_WEB_CONFIG_FILE, --web.config.file)
# web_config_file = "/etc/gpumon/web.yml"

[record]
# Record each trainer session's lines as a trace file (hello first) for `gpumon analyze`.
# Unset: nothing is recorded. An absolute path here; --record-dir and GPUMON_RECORD_DIR may
# be relative to the current directory.  (GPUMON_RECORD_DIR, --record-dir)
# dir = "/var/lib/gpumon/traces"
# A trace past this size continues in a new part file, which starts with the hello again.
max_file_bytes = {max_file_bytes}
# The oldest finished traces are deleted to keep the directory under this size...
max_total_bytes = {max_total_bytes}
# ...and under this many trace files (a flood of short sessions leaves many small ones).
max_files = {max_files}

[detect]
# near_limit also fires when headroom at the step peak (device free + reserved - peak allocated)
# stays under this many bytes. Under an allocator cap (set_per_process_memory_fraction) the
# headroom is to the cap, and the margin is at most a tenth of the cap.
headroom_margin_bytes = {headroom_margin_bytes}
# A leak is reported once the per-step floor has grown by this share of the device's memory.
leak_materiality_ratio = {leak_materiality_ratio}
# How long a crash finding (trainer gone without bye) stays firing.
crash_hold = "{crash_hold}"

[attribution]
# When a leak finding goes pending or firing, ask the trainer (only clients that announce the
# `attribution` capability) to record allocation history for a short window and report which
# lines of its code allocate the growing memory; the leak finding then names them.
enabled = {attr_enabled}
# The window lasts this many steps at most (a fast leak gets fewer: about 32 MiB of growth, at
# least 20 steps)...
window_steps = {window_steps}
# ...or this many seconds, whichever comes first. A window unanswered after twice this plus a
# minute counts as failed.
window_seconds = {window_seconds:?}
# Allocation records torch keeps while recording (at most 100000; each holds a stack).
max_entries = {max_entries}
# Allocation sites reported, largest first (1 to 20).
top = {top}
# Seconds between two requests to the same trainer, at least.
cooldown_seconds = {cooldown_seconds:?}

[oom]
# When an OOM is likely (a near_limit finding fires, or a leak's forecast puts the OOM within
# arm_eta_seconds), ask the trainer (only clients that announce the `oom_history` capability) to
# keep allocation history recording, so the OOM, when it comes, is explained with its lines.
# Recording slows each step (about a fifth on a short H100 step): it is capped in time.
arm = {oom_arm}
# Arm when a leak's OOM forecast is within this many seconds.
arm_eta_seconds = {arm_eta_seconds:?}
# One arming lasts at most this many seconds (ended sooner when the risk has passed).
arm_seconds = {arm_seconds:?}
# Allocation records torch keeps while armed (at most 100000; each holds a stack).
max_entries = {oom_max_entries}
# For near_limit, after this many steps recorded the trainer reports what was live at the step's
# peak, by allocation site (0: not asked).
peak_after_steps = {peak_after_steps}
# Seconds between two armings of the same trainer, at least.
rearm_seconds = {rearm_seconds:?}

[alerts]
# Firing and resolved findings always go to the log. They can also go to:
# Alertmanager (v2 API), e.g. "http://127.0.0.1:9093".  (GPUMON_ALERTMANAGER_URL, --alertmanager-url)
# alertmanager_url = "http://127.0.0.1:9093"
# A JSON webhook (POST).  (GPUMON_WEBHOOK_URL, --webhook-url)
# webhook_url = "http://127.0.0.1:8080/gpumon"
# Firing findings are sent to Alertmanager again this often.
resend_interval = "{resend_interval}"

[kubernetes]
# GPU processes and trainer sessions in Kubernetes pods carry pod and namespace labels. The pod
# UID comes from the process's cgroup; names come from the kubelet's pods API at this URL, read
# again (at most every 30s) when a pod or container not seen before appears. `${{NAME}}` is taken
# from the environment. Unset: the pod label is the pod UID and namespace is empty.
# kubelet_url = "https://${{NODE_IP}}:10250"
# Bearer token sent to the kubelet (the pod's service-account token; it needs `get` on
# nodes/pods, or nodes/proxy before Kubernetes 1.33). Read at every request.
token_file = "{token_file}"
# CA bundle that verifies the kubelet's serving certificate (signed by the cluster CA when the
# kubelet runs with serverTLSBootstrap).
ca_file = "{ca_file}"
# The kubelet's certificate is self-signed (kubeadm's default without serverTLSBootstrap):
# skip verifying it. The token then goes to whatever answers at kubelet_url.
insecure_skip_verify = {insecure_skip_verify}
"#,
        listen = d.listen,
        nvml_lib = d.nvml_lib,
        procfs = d.procfs.display(),
        interval = humantime::format_duration(d.interval),
        log_format = match d.log_format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        },
        log_level = d.log_level,
        gpu_points = d.history.gpu_points,
        max_connections = d.ingest.max_connections,
        max_lines_per_second = d.ingest.max_lines_per_second,
        hello_timeout_seconds = d.ingest.hello_timeout_seconds,
        idle_timeout_seconds = d.ingest.idle_timeout_seconds,
        max_connections_per_uid = d.ingest.max_connections_per_uid,
        reserved_connections = d.ingest.reserved_connections,
        max_line_buffer_bytes = d.ingest.max_line_buffer_bytes,
        connection_limit = d.http.connection_limit,
        header_timeout_seconds = d.http.header_timeout_seconds,
        keepalive_timeout_seconds = d.http.keepalive_timeout_seconds,
        max_request_head_bytes = d.http.max_request_head_bytes,
        shutdown_grace_seconds = d.http.shutdown_grace_seconds,
        max_file_bytes = d.record.max_file_bytes,
        max_total_bytes = d.record.max_total_bytes,
        max_files = d.record.max_files,
        headroom_margin_bytes = d.detect.headroom_margin_bytes,
        leak_materiality_ratio = d.detect.leak_materiality_ratio,
        crash_hold = humantime::format_duration(d.detect.crash_hold),
        attr_enabled = d.attribution.enabled,
        window_steps = d.attribution.window_steps,
        window_seconds = d.attribution.window_seconds,
        max_entries = d.attribution.max_entries,
        top = d.attribution.top,
        cooldown_seconds = d.attribution.cooldown_seconds,
        oom_arm = d.oom.arm,
        arm_eta_seconds = d.oom.arm_eta_seconds,
        arm_seconds = d.oom.arm_seconds,
        oom_max_entries = d.oom.max_entries,
        peak_after_steps = d.oom.peak_after_steps,
        rearm_seconds = d.oom.rearm_seconds,
        resend_interval = humantime::format_duration(d.alerts.resend_interval),
        token_file = d.kubernetes.token_file.display(),
        ca_file = d.kubernetes.ca_file.display(),
        insecure_skip_verify = d.kubernetes.insecure_skip_verify,
    )
}

pub mod env;
mod log_filter;
pub mod oom;

#[cfg(test)]
mod tests;
