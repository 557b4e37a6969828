//! Detection: what is going wrong with a trainer's memory, judged from its own samples. One small
//! trait, one file per detector; the same code runs live (per session, as lines arrive) and in
//! `gpumon analyze` (replaying trace files), so an offline verdict is the live one.

pub mod attribution;
pub mod crash;
pub mod explanation;
pub mod findings;
pub mod fragmentation;
pub mod leak;
pub mod lifecycle;
pub mod message;
pub mod near_limit;
pub mod oom;
pub mod orphan;
pub mod peak;
pub mod session;
pub mod stats;
pub mod window;

use serde::{Deserialize, Serialize};

use crate::core::model::Timestamp;
use crate::core::trainer::EventRecord;
use crate::core::trainer::Sample;

pub use findings::{Finding, FindingState, Findings};
pub use session::SessionDetect;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Leak,
    NearLimit,
    Fragmentation,
    Oom,
    Crash,
    /// Memory outside PyTorch's caching allocator (NVML's figure minus reserved) keeps growing.
    UntrackedGrowth,
    /// NVML lists memory for a process that has exited (orphan.rs).
    OrphanedMemory,
    /// The trainer was stopped by a signal it received (SIGTERM, SIGINT, SIGHUP): Ctrl-C,
    /// `timeout`, scancel, `kubectl delete`, preemption. An end, not a failure.
    Stopped,
    /// Reserved memory (PyTorch's cache) keeps growing while allocated stays flat.
    CacheGrowth,
    /// A kind this build does not know (a newer daemon's): read, shown by name, never raised.
    #[serde(other)]
    Unknown,
}

impl Kind {
    /// Slots for per-kind counters: the known kinds, then `Unknown`.
    pub const SLOTS: usize = Kind::ALL.len() + 1;

    pub const ALL: [Kind; 9] = [
        Kind::Leak,
        Kind::NearLimit,
        Kind::Fragmentation,
        Kind::Oom,
        Kind::Crash,
        Kind::UntrackedGrowth,
        Kind::OrphanedMemory,
        Kind::Stopped,
        Kind::CacheGrowth,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Leak => "leak",
            Kind::NearLimit => "near_limit",
            Kind::Fragmentation => "fragmentation",
            Kind::Oom => "oom",
            Kind::Crash => "crash",
            Kind::UntrackedGrowth => "untracked_growth",
            Kind::OrphanedMemory => "orphaned_memory",
            Kind::Stopped => "stopped",
            Kind::CacheGrowth => "cache_growth",
            Kind::Unknown => "unknown",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

// `index()` is the declaration order: ALL must list every known kind, in order, with Unknown
// last, or per-kind counters would land in another kind's slot. Checked when compiling.
const _: () = {
    let mut i = 0;
    while i < Kind::ALL.len() {
        assert!(Kind::ALL[i] as usize == i);
        i += 1;
    }
    assert!(Kind::Unknown as usize == Kind::ALL.len());
};

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The numbers behind a finding; which are set depends on the kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slope_bytes_per_step: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slope_bytes_per_second: Option<f64>,
    /// leak: how much the floor grew since `onset_step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// leak: the step from which the floor has been rising, fixed when the leak was first seen
    /// (the start of the window that showed it then); the window slides on, the onset stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onset_step: Option<u64>,
    /// leak: the floor at `onset_step`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onset_floor_bytes: Option<u64>,
    /// leak: the floor now (robust to spikes: see leak.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_bytes: Option<u64>,
    /// leak: where the window behind the current slope starts, and the floor's growth since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_start_step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_growth_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_eta_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_eta_seconds: Option<f64>,
    /// Allocator retries counted in the detector's window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragmented_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// The allocator's cap (`set_per_process_memory_fraction`), when it is below the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// oom: what the trainer read in its allocator at the OOM (pattern, lines, live sites).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Box<explanation::Explanation>>,
    /// near_limit, oom, untracked_growth: the process's memory outside PyTorch's caching
    /// allocator (NVML's figure minus reserved) at the time, when the ledger could say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside_allocator_bytes: Option<u64>,
    /// near_limit, oom: where the memory went at the latest measured step (categories.rs), the
    /// batch that fits and the remedies with their size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<Box<crate::core::categories::CategoryEvidence>>,
    /// oom: samples arrived after the OOM, so the trainer caught it and went on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survived: Option<bool>,
    /// oom: the step of the first sample after the OOM, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survived_step: Option<u64>,
    /// cache_growth: the trainer's `PYTORCH_CUDA_ALLOC_CONF`, as its hello sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_conf: Option<String>,
    /// orphaned_memory: the bytes held, the process's state and what gpumon knew of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan: Option<Box<orphan::OrphanEvidence>>,
    /// stopped: the signal the trainer said it received (`SIGTERM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// crash: the exception the trainer said it died of (`RuntimeError: boom`), bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<String>,
}

/// A detector's verdict after one observation.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    /// The condition holds now (the lifecycle turns streaks of these into firing/resolved).
    pub active: bool,
    pub evidence: Evidence,
}

/// Where an observation sits in the run: its step (absent on timer samples) and its time.
/// Windows and quiet periods are measured in both, never in a count of samples, because the
/// client samples at most 10 times a second and, on slow steps, only every few steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pos {
    pub step: Option<u64>,
    pub ts: Timestamp,
}

/// A position at `step` and `ts`, for the detectors' tests.
#[cfg(test)]
pub(crate) fn pos_at(step: u64, ts: Timestamp) -> Pos {
    Pos {
        step: Some(step),
        ts,
    }
}

impl Pos {
    /// Whether `later` is at least `steps` steps and `secs` seconds on from here. Steps count
    /// only when both ends have one (a timer sample has none) and the count did not start over
    /// (a trainer that restarts its step count would otherwise hold a window open for good).
    pub fn reached(&self, later: &Pos, steps: u64, secs: f64) -> bool {
        let by_steps = match (self.step, later.step) {
            (Some(a), Some(b)) if b >= a => b - a >= steps,
            _ => true,
        };
        by_steps && later.ts - self.ts >= secs
    }
}

/// One sample as detectors see it, with the session's reset-proof counters and the latest
/// allocator cap the session reported.
pub struct Obs<'a> {
    pub sample: &'a Sample,
    pub retries_total: u64,
    pub ooms_total: u64,
    pub alloc_limit: Option<u64>,
    /// The process's memory outside the caching allocator at this sample (ledger.rs), when
    /// NVML's figure for it is this session's alone and recent enough.
    pub outside: Option<u64>,
    /// The session's measured splits (categories.rs), when any arrived.
    pub categories: Option<&'a crate::core::categories::Tracker>,
    /// The job's ranks (hello's `world_size`): sharding the optimizer state spreads it so.
    pub world_size: Option<u64>,
    /// The allocator settings the hello sent (`PYTORCH_CUDA_ALLOC_CONF`), for cache_growth's hint.
    pub alloc_conf: Option<&'a str>,
}

impl<'a> Obs<'a> {
    /// `sample` alone: no counters, cap, outside figure, split, ranks or allocator settings
    /// (set the ones known with struct update syntax).
    pub fn of(sample: &'a Sample) -> Self {
        Self {
            sample,
            retries_total: 0,
            ooms_total: 0,
            alloc_limit: None,
            outside: None,
            categories: None,
            world_size: None,
            alloc_conf: None,
        }
    }
}

impl Obs<'_> {
    pub fn ts(&self) -> Timestamp {
        self.sample.ts
    }

    pub fn pos(&self) -> Pos {
        Pos {
            step: self.sample.step,
            ts: self.sample.ts,
        }
    }

    /// What the caching allocator could hold at most (`Sample::allocator_limit`).
    pub fn limit(&self) -> Option<u64> {
        self.sample.allocator_limit(self.alloc_limit)
    }

    /// What a batch must fit under at this sample: its limit, cap and split blocks.
    pub fn budget(&self) -> crate::core::categories::Budget {
        crate::core::categories::Budget {
            limit: self.limit(),
            cap: self.cap(),
            inactive_split: self.sample.stats.inactive_split,
        }
    }

    /// The split, the batch that fits and the remedies, against this sample's limit.
    pub fn categories(&self) -> Option<Box<crate::core::categories::CategoryEvidence>> {
        self.categories?
            .evidence(self.budget(), self.world_size)
            .map(Box::new)
    }

    /// The most this process can ever use: the device, or the cap when it is lower.
    pub fn capacity(&self) -> Option<u64> {
        min_known(self.sample.device_total, self.alloc_limit)
    }

    /// The cap, when it binds: below the device total (or the device total is unknown). A cap
    /// at or above the device (torch reports the total when no fraction is set) is no cap.
    pub fn cap(&self) -> Option<u64> {
        cap(self.alloc_limit, self.sample.device_total)
    }

    /// What the allocator could still take on top of what it reserved: the device's free memory,
    /// or what is left under the cap when that is less. None without either.
    pub fn room(&self) -> Option<u64> {
        let s = self.sample;
        let under_cap = self
            .alloc_limit
            .map(|l| l.saturating_sub(s.stats.reserved.unwrap_or(0)));
        min_known(s.device_free, under_cap)
    }
}

/// The cap named in messages: `limit` when it is below the device total or that is unknown.
pub fn cap(limit: Option<u64>, device_total: Option<u64>) -> Option<u64> {
    limit.filter(|l| device_total.is_none_or(|t| *l < t))
}

/// The smaller of two optional bounds; either alone when the other is unknown.
fn min_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub trait Detector: Send + Sync {
    fn kind(&self) -> Kind;
    /// None: no opinion from this observation (e.g. not enough data yet).
    fn sample(&mut self, obs: &Obs) -> Option<Signal>;
    /// An event, with the explanation an `oom` event carried (kept apart from the record: the
    /// session's event ring keeps records, and only the finding keeps the explanation).
    fn event(
        &mut self,
        _e: &EventRecord,
        _explanation: Option<&explanation::Explanation>,
    ) -> Option<Signal> {
        None
    }
}

/// The cascade window when the config does not set one: torchrun tears the other ranks of a job
/// down within seconds of the first failure; the NCCL watchdog only after its timeout.
pub const DEFAULT_JOB_CASCADE_SECONDS: f64 = 60.0;

/// Settings from the `[detect]` config section.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DetectConfig {
    /// near_limit also fires when headroom (what the allocator could hold, `Obs::limit`, minus
    /// the allocated peak) stays under this many bytes, or under a tenth of the allocator's cap
    /// when one binds and that is less.
    pub headroom_margin_bytes: u64,
    /// A leak is reported only once the floor has grown by this share of the device memory.
    pub leak_materiality_ratio: f64,
    /// Seconds a crash finding stays firing after its session ended.
    pub crash_hold_seconds: f64,
    /// Seconds after a job's first failure within which another rank's failure is its
    /// consequence (`detect.job_cascade`).
    pub job_cascade_seconds: f64,
    /// Seconds NVML must keep listing memory of an exited process before orphaned_memory fires
    /// (`detect.orphan_grace`): the driver frees a context some moments after its process ends.
    pub orphan_grace_seconds: f64,
}

impl Default for DetectConfig {
    fn default() -> Self {
        Self {
            headroom_margin_bytes: 512 << 20,
            leak_materiality_ratio: 0.005,
            crash_hold_seconds: 600.0,
            job_cascade_seconds: DEFAULT_JOB_CASCADE_SECONDS,
            orphan_grace_seconds: orphan::DEFAULT_GRACE_SECONDS,
        }
    }
}
