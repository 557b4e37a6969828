//! The JSON API's document: everything the daemon knows right now. `gpumon status` and the TUI
//! read it back, so it is one owned type that both serialises and deserialises.

use serde::{Deserialize, Serialize};

use crate::ingest::protocol::Stats;
use crate::model::{GpuReading, ProcessReading, Timestamp};
use crate::store::sessions::{Ending, EventRecord, Session, SessionPoint};
use crate::store::{GpuPoint, NvmlStatus, Point, Store};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: String,
    pub hostname: String,
    pub ts: Timestamp,
    pub nvml: NvmlView,
    pub gpus: Vec<GpuView>,
    pub processes: Vec<ProcessReading>,
    /// Trainer sessions: live ones, then recently ended ones.
    #[serde(default)]
    pub sessions: Vec<SessionView>,
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
            sessions: store
                .sessions
                .live()
                .chain(store.sessions.ended())
                .map(|sess| {
                    SessionView::of(sess, latest.map(|r| r.gpus.as_slice()).unwrap_or_default())
                })
                .collect(),
            findings: Vec::new(),
        }
    }
}

/// Points of session history the snapshot carries (the TUI's chart window).
const SESSION_POINTS: usize = 300;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionView {
    pub session: String,
    /// Host pid, from the kernel (SO_PEERCRED): the pid NVML reports.
    pub pid: u32,
    /// The pid the trainer sees itself as (differs inside a container).
    pub ns_pid: Option<u64>,
    pub uid: u32,
    pub job: Option<String>,
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub gpu_uuid: Option<String>,
    /// NVML index of that GPU, when NVML lists it.
    pub gpu: Option<u32>,
    pub torch: Option<String>,
    pub client: Option<String>,
    pub started: Timestamp,
    pub samples: u64,
    pub last_sample_ts: Option<Timestamp>,
    pub step: Option<u64>,
    pub phase: Option<String>,
    pub stats: Option<Stats>,
    pub device_free: Option<u64>,
    pub device_total: Option<u64>,
    pub alloc_retries_total: u64,
    pub ooms_total: u64,
    pub ended: Option<(Timestamp, Ending)>,
    pub events: Vec<EventRecord>,
    /// Recent step-boundary points, oldest first.
    pub series: Vec<Point<SessionPoint>>,
}

impl SessionView {
    /// One session, live or recently ended, as it appears in the snapshot's `sessions`.
    pub fn lookup(store: &Store, id: &str) -> Option<Self> {
        let gpus = store
            .latest()
            .map(|r| r.gpus.as_slice())
            .unwrap_or_default();
        store.sessions.get(id).map(|s| Self::of(s, gpus))
    }

    fn of(s: &Session, gpus: &[GpuReading]) -> Self {
        let last = s.last_sample.as_ref().map(|(_, x)| x);
        let skip = s.series.len().saturating_sub(SESSION_POINTS);
        Self {
            session: s.id.clone(),
            pid: s.peer.pid,
            ns_pid: s.hello.ns_pid,
            uid: s.peer.uid,
            job: s.hello.job.clone(),
            rank: s.hello.rank,
            world_size: s.hello.world_size,
            gpu_uuid: s.hello.gpu_uuid.clone(),
            gpu: gpus
                .iter()
                .find(|g| Some(&g.identity.uuid) == s.hello.gpu_uuid.as_ref())
                .map(|g| g.identity.index),
            torch: s.hello.torch.clone(),
            client: s.hello.client.clone(),
            started: s.started,
            samples: s.samples,
            last_sample_ts: s.last_sample.as_ref().map(|(t, _)| *t),
            step: last.and_then(|x| x.step),
            phase: last.map(|x| x.phase.clone()),
            stats: last.map(|x| x.stats),
            device_free: last.and_then(|x| x.device_free),
            device_total: last.and_then(|x| x.device_total),
            alloc_retries_total: s.retries.total,
            ooms_total: s.ooms.total,
            ended: s.ended,
            events: s.events.iter().cloned().collect(),
            series: s.series.iter().skip(skip).collect(),
        }
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
