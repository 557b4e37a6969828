//! The daemon's memory: the latest collection plus bounded history per GPU and per (GPU, pid).
//! Everything is keyed by what is alive in the latest collection, so processes that end are
//! dropped at the next collection and memory stays bounded however many pids come and go.

pub mod ring;
pub mod session_series;
pub mod sessions;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::model::{GpuState, NodeReading, Timestamp};
pub use ring::{Point, Series};

/// How much history to keep. Sizes are in points, one point per collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    pub gpu_points: usize,
    pub process_points: usize,
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
}

pub struct Store {
    limits: HistoryLimits,
    interval: f64,
    pub nvml: NvmlStatus,
    /// Trainer sessions pushed over the ingest socket.
    pub sessions: sessions::Sessions,
    /// Bumped by every collection, so outputs can cache what they derive from one.
    generation: u64,
    latest: Option<NodeReading>,
    gpu_series: HashMap<String, Series<GpuPoint>>,
    process_series: HashMap<(u32, u32), Series<u64>>,
}

pub type SharedStore = Arc<RwLock<Store>>;

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
            generation: 0,
            latest: None,
            gpu_series: HashMap::new(),
            process_series: HashMap::new(),
        }
    }

    /// NVML index (as a label value) of the GPU with this UUID, or of the parent of this MIG
    /// device, in the latest collection.
    pub fn gpu_index(&self, uuid: &str) -> Option<String> {
        let gpus = &self.latest.as_ref()?.gpus;
        gpus.iter()
            .find(|g| g.identity.uuid == uuid || g.mig_devices.iter().any(|m| m.uuid == uuid))
            .map(|g| g.identity.index.to_string())
    }

    pub fn shared(self) -> SharedStore {
        Arc::new(RwLock::new(self))
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn latest(&self) -> Option<&NodeReading> {
        self.latest.as_ref()
    }

    pub fn gpu_series(&self, uuid: &str) -> Option<&Series<GpuPoint>> {
        self.gpu_series.get(uuid)
    }

    pub fn process_series(&self, gpu: u32, pid: u32) -> Option<&Series<u64>> {
        self.process_series.get(&(gpu, pid))
    }

    pub fn series_counts(&self) -> (usize, usize) {
        (self.gpu_series.len(), self.process_series.len())
    }

    /// Records a successful collection.
    pub fn apply(&mut self, reading: NodeReading, duration: f64) {
        let ts = reading.ts;
        self.sessions.tick(ts);
        self.nvml.up = true;
        self.nvml.error = None;
        self.note_poll(ts, duration);

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

        let alive: HashSet<(u32, u32)> = reading.processes.iter().map(|p| (p.gpu, p.pid)).collect();
        self.process_series.retain(|key, _| alive.contains(key));
        for p in &reading.processes {
            let cap = self.limits.process_points;
            self.process_series
                .entry((p.gpu, p.pid))
                .or_insert_with(|| Series::new(cap))
                .push(ts, p.used_memory_bytes, self.interval);
        }
        self.latest = Some(reading);
    }

    /// Records a collection that could not run at all (library missing, init failed, ...).
    /// The last reading is dropped: serving stale numbers as current would mislead.
    pub fn apply_failure(&mut self, ts: Timestamp, error: String, duration: f64) {
        self.sessions.tick(ts);
        self.nvml.up = false;
        self.nvml.error = Some(error);
        self.nvml.poll_errors_total += 1;
        self.note_poll(ts, duration);
        self.latest = None;
        self.process_series.clear();
        for series in self.gpu_series.values_mut() {
            series.push(ts, None, self.interval);
        }
    }

    fn note_poll(&mut self, ts: Timestamp, duration: f64) {
        self.generation += 1;
        self.nvml.polls_total += 1;
        self.nvml.last_poll_ts = Some(ts);
        self.nvml.last_poll_duration_seconds = duration;
    }
}

#[cfg(test)]
mod tests;
