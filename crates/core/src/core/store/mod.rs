//! The daemon's memory: the latest collection plus bounded history per GPU and per (GPU, pid).
//! Everything is keyed by what is alive in the latest collection, so processes that end are
//! dropped at the next collection and memory stays bounded however many pids come and go.

pub mod chunks;
pub mod series;
pub mod session_series;
pub mod sessions;

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::core::detect::orphan::Orphans;
use crate::core::jobs::{Jobs, Rules};
use crate::core::model::{GpuState, NodeReading, Timestamp};
pub use series::{Point, Series};

/// How much history to keep. Sizes are in points, one point per collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    pub gpu_points: usize,
}

/// The GPU values worth charting.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GpuPoint {
    pub used: u64,
    pub reserved: u64,
    pub free: u64,
    pub utilization: Option<f32>,
}

/// The daemon's view of its NVML connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NvmlStatus {
    pub up: bool,
    /// Why NVML is down, or the last poll error, in words.
    pub error: Option<String>,
    pub library: String,
    pub last_poll_ts: Option<Timestamp>,
    pub last_poll_duration_seconds: f64,
    pub polls_total: u64,
    pub poll_errors_total: u64,
    /// Which processes the source's /proc shows (whether a pid missing there has exited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proc_view: Option<crate::core::model::ProcView>,
    /// The library's identity when it is a fake NVML (crates/fake-nvml): readings are a
    /// scenario's, not this machine's GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<String>,
}

impl NvmlStatus {
    /// A poll that read the node.
    pub fn record_ok(&mut self, ts: Timestamp, duration: f64) {
        self.up = true;
        self.error = None;
        self.record(ts, duration);
    }

    /// A poll that could not run at all (library missing, init failed, ...).
    pub fn record_failure(&mut self, ts: Timestamp, error: String, duration: f64) {
        self.up = false;
        self.error = Some(error);
        self.poll_errors_total += 1;
        self.record(ts, duration);
    }

    fn record(&mut self, ts: Timestamp, duration: f64) {
        self.polls_total += 1;
        self.last_poll_ts = Some(ts);
        self.last_poll_duration_seconds = duration;
    }
}

/// One poll's outcome as the poller hands it over: the reading (or why there is none), NVML's
/// health as the poller counts it, and the NVML metric families already encoded, so neither
/// the store's owner nor a scrape spends time on them.
#[derive(Debug, Clone)]
pub struct Collection {
    pub ts: Timestamp,
    pub reading: Result<Arc<NodeReading>, String>,
    pub status: NvmlStatus,
    pub text: Arc<str>,
}

pub struct Store {
    limits: HistoryLimits,
    interval: f64,
    pub nvml: NvmlStatus,
    /// Trainer sessions pushed over the ingest socket.
    pub sessions: sessions::Sessions,
    /// The sessions of one run, grouped (jobs.md): each session joins its job as it opens and
    /// leaves it as it closes, and the job outlives its sessions.
    pub jobs: Jobs,
    /// Memory NVML lists for processes that have exited (orphaned_memory), beside the sessions
    /// that tell whose it was.
    pub orphans: Orphans,
    /// Bumped by every collection, so outputs can cache what they derive from one.
    generation: u64,
    latest: Option<Arc<NodeReading>>,
    /// (pid, index) of the latest reading's processes, by pid: `process_of` is asked for every
    /// session of every snapshot, and scanning a thousand processes for each was a tenth of a
    /// delta answer. 8 bytes a process, rebuilt in place per collection.
    by_pid: Vec<(u32, u32)>,
    /// The latest collection's NVML families as exposition text.
    gpu_text: Arc<str>,
    gpu_series: HashMap<String, Series>,
    /// GPU indexes a replayed trace noted for its device (`trace_gpu`), by UUID: what the daemon
    /// resolved when it recorded, where no reading can answer. Empty in a running daemon.
    noted_gpus: HashMap<String, u32>,
}

impl Store {
    pub fn new(limits: HistoryLimits, interval: f64, library: String) -> Self {
        Self {
            limits,
            interval,
            nvml: NvmlStatus {
                library,
                ..NvmlStatus::default()
            },
            sessions: sessions::Sessions::new(sessions::SessionLimits::default()),
            jobs: Jobs::default(),
            orphans: Orphans::default(),
            generation: 0,
            latest: None,
            by_pid: Vec::new(),
            gpu_text: Arc::from(""),
            gpu_series: HashMap::new(),
            noted_gpus: HashMap::new(),
        }
    }

    /// Takes `sessions` (as the daemon or a replay configured them), with no job yet, judged
    /// by the rules of the same detection config (its cascade window).
    pub fn set_sessions(&mut self, sessions: sessions::Sessions) {
        self.jobs = Jobs::new(Rules::of(sessions.detect_config()));
        self.sessions = sessions;
    }

    /// Opens a session (`Sessions::open`), a rank of its job.
    pub fn open(
        &mut self,
        peer: crate::core::trainer::Peer,
        hello: crate::core::trainer::Hello,
        now: Timestamp,
    ) -> (u64, String) {
        self.sessions.open(&mut self.jobs, peer, hello, now)
    }

    /// Opens a session under a given id (`Sessions::open_as`: a replay's, as its daemon named it).
    pub fn open_as(
        &mut self,
        id: String,
        peer: crate::core::trainer::Peer,
        hello: crate::core::trainer::Hello,
        now: Timestamp,
    ) -> (u64, String) {
        self.sessions.open_as(&mut self.jobs, id, peer, hello, now)
    }

    /// Ends session `key` (`Sessions::close_as`); its job hears it left.
    pub fn close_as(
        &mut self,
        key: u64,
        ending: crate::core::trainer::Ending,
        now: Timestamp,
        how: &str,
    ) {
        self.sessions
            .close_as(&mut self.jobs, key, ending, now, how);
    }

    /// `close_as`, with how it ended said by `ending` alone.
    pub fn close(&mut self, key: u64, ending: crate::core::trainer::Ending, now: Timestamp) {
        self.sessions.close(&mut self.jobs, key, ending, now);
    }

    /// NVML index of the GPU with this UUID, or of the parent of this MIG device, in the latest
    /// collection: the one GPU join every output uses.
    /// On replay, the index the trace noted.
    pub fn gpu_index(&self, uuid: &str) -> Option<u32> {
        self.latest
            .as_ref()
            .and_then(|r| r.gpu_index_of(uuid))
            .or_else(|| self.noted_gpus.get(uuid).copied())
    }

    /// A replayed trace's `trace_gpu`: the GPU the daemon resolved `uuid` to when recording.
    pub fn note_gpu(&mut self, uuid: String, gpu: u32) {
        self.noted_gpus.insert(uuid, gpu);
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Fills in a finding's `gpu` (the NVML index of its device, MIG-aware).
    pub fn resolve_gpu(&self, f: &mut crate::core::detect::Finding) {
        f.gpu = f
            .subject
            .gpu_uuid
            .as_deref()
            .and_then(|u| self.gpu_index(u));
    }

    /// Every finding firing now: the sessions' (live and held) and orphaned memory.
    pub fn firing(&self) -> impl Iterator<Item = &crate::core::detect::Finding> {
        self.sessions.firing().chain(self.orphans.current())
    }

    /// Firing findings as alert sinks resend them, GPU resolved.
    pub fn firing_resolved(&self) -> Vec<crate::core::detect::Finding> {
        self.firing()
            .map(|f| {
                let mut f = f.clone();
                self.resolve_gpu(&mut f);
                f
            })
            .collect()
    }

    /// Session `s`'s process in the latest collection (`sessions::nvml::process_of`).
    pub fn process_of(&self, s: &sessions::Session) -> sessions::nvml::ProcessOf<'_> {
        let Some(r) = self.latest() else {
            return Default::default();
        };
        let pid = s.peer.pid;
        let from = self.by_pid.partition_point(|(p, _)| *p < pid);
        let entries = self.by_pid[from..]
            .iter()
            .take_while(|(p, _)| *p == pid)
            .filter_map(|(_, i)| r.processes.get(*i as usize));
        sessions::nvml::process_of(s, entries)
    }

    pub fn latest(&self) -> Option<&NodeReading> {
        self.latest.as_deref()
    }

    /// The latest reading, shared (the view holds it without a copy).
    pub fn latest_shared(&self) -> Option<Arc<NodeReading>> {
        self.latest.clone()
    }

    pub fn gpu_text(&self) -> &Arc<str> {
        &self.gpu_text
    }

    pub fn gpu_series(&self, uuid: &str) -> Option<&Series> {
        self.gpu_series.get(uuid)
    }

    /// GPUs with history (one series each).
    pub fn gpu_series_count(&self) -> usize {
        self.gpu_series.len()
    }

    /// Takes in what the poller collected, with NVML's health as the poller counted it.
    pub fn apply_collection(&mut self, c: Collection) {
        self.gpu_text = c.text;
        // The poller does not know which library the config named; the store was told.
        let library = std::mem::take(&mut self.nvml.library);
        self.nvml = c.status;
        self.nvml.library = library;
        match c.reading {
            Ok(r) => self.apply_reading(r),
            Err(_) => self.apply_missing(c.ts),
        }
    }

    /// Records a successful collection, counting the poll here (readers without a poller:
    /// `status --direct`, tests).
    pub fn apply(&mut self, reading: NodeReading, duration: f64) {
        self.nvml.record_ok(reading.ts, duration);
        self.apply_reading(Arc::new(reading));
    }

    /// Records a collection that could not run at all (library missing, init failed, ...).
    pub fn apply_failure(&mut self, ts: Timestamp, error: String, duration: f64) {
        self.nvml.record_failure(ts, error, duration);
        self.apply_missing(ts);
    }

    fn apply_reading(&mut self, reading: Arc<NodeReading>) {
        let ts = reading.ts;
        self.sessions.tick(ts);
        self.sessions.polled(&reading);
        self.sessions
            .orphans_polled(&self.jobs, &mut self.orphans, &reading, self.nvml.proc_view);
        self.sessions.devices = Some(reading.clone());
        self.generation += 1;
        self.gpu_series
            .retain(|uuid, _| reading.gpus.iter().any(|g| &g.identity.uuid == uuid));
        for gpu in &reading.gpus {
            let point = match (gpu.state, gpu.memory) {
                (GpuState::Ok, Some(m)) => Some(GpuPoint {
                    used: m.used,
                    reserved: m.reserved,
                    free: m.free,
                    utilization: gpu.utilization.map(|u| u as f32),
                }),
                _ => None,
            };
            let cap = self.limits.gpu_points;
            self.gpu_series
                .entry(gpu.identity.uuid.clone())
                .or_insert_with(|| Series::new(cap))
                .push(ts, point, self.interval);
        }
        // Processes get no history of their own: nothing reads it (trainers have theirs, in
        // their sessions), and at 16 GPUs x 512 processes it was most of the daemon's memory.
        self.by_pid.clear();
        self.by_pid
            .extend((0u32..).zip(&reading.processes).map(|(i, p)| (p.pid, i)));
        self.by_pid.sort_unstable();
        self.latest = Some(reading);
    }

    /// The last reading is dropped: serving stale numbers as current would mislead.
    fn apply_missing(&mut self, ts: Timestamp) {
        self.sessions.tick(ts);
        self.sessions.devices = None;
        self.generation += 1;
        self.latest = None;
        self.by_pid.clear();
        for series in self.gpu_series.values_mut() {
            series.push(ts, None, self.interval);
        }
    }
}

#[cfg(test)]
mod tests;
