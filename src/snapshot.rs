//! The JSON API's document: everything the daemon knows right now. `gpumon status` and the TUI
//! read it back, so it is one owned type that both serialises and deserialises.

use serde::{Deserialize, Serialize};

use crate::model::{GpuReading, ProcessReading, Timestamp};
use crate::store::{GpuPoint, NvmlStatus, Point, Store};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: String,
    pub hostname: String,
    pub ts: Timestamp,
    pub nvml: NvmlView,
    pub gpus: Vec<GpuView>,
    pub processes: Vec<ProcessReading>,
    /// Trainer sessions (filled by ingest).
    #[serde(default)]
    pub sessions: Vec<serde_json::Value>,
    /// Firing and recently resolved findings (filled by detection).
    #[serde(default)]
    pub findings: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NvmlView {
    pub up: bool,
    pub error: Option<String>,
    pub library: String,
    pub driver_version: Option<String>,
    pub last_poll_ts: Option<Timestamp>,
    pub last_poll_duration_seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuView {
    #[serde(flatten)]
    pub reading: GpuReading,
    /// Memory history, oldest first; `value: null` marks a missed poll.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Point<GpuPoint>>,
}

impl Snapshot {
    /// Builds the document; `history_seconds` of GPU history are included (0 for none).
    pub fn build(store: &Store, hostname: &str, history_seconds: f64) -> Self {
        let latest = store.latest();
        let now = crate::model::now();
        let gpus = latest
            .map(|r| {
                r.gpus
                    .iter()
                    .map(|g| GpuView {
                        reading: g.clone(),
                        history: match store.gpu_series(&g.identity.uuid) {
                            Some(s) if history_seconds > 0.0 => {
                                s.since(now - history_seconds).copied().collect()
                            }
                            _ => Vec::new(),
                        },
                    })
                    .collect()
            })
            .unwrap_or_default();
        let NvmlStatus {
            up,
            error,
            library,
            last_poll_ts,
            last_poll_duration_seconds,
            ..
        } = store.nvml.clone();
        Self {
            version: env!("CARGO_PKG_VERSION").to_string(),
            hostname: hostname.to_string(),
            ts: now,
            nvml: NvmlView {
                up,
                error,
                library,
                driver_version: latest.and_then(|r| r.driver_version.clone()),
                last_poll_ts,
                last_poll_duration_seconds,
            },
            gpus,
            processes: latest.map(|r| r.processes.clone()).unwrap_or_default(),
            sessions: Vec::new(),
            findings: Vec::new(),
        }
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
