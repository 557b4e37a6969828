//! The trainer side of the domain: what a trainer says (hello, samples, events), who it is
//! (its peer), and what the daemon keeps of it (session points, event records, how it ended).
//! The wire protocol (`ingest::protocol`) parses into these; the store and detection use only
//! these, so neither depends on the wire format or on each other's internals.

use serde::{Deserialize, Serialize};

use crate::core::detect::explanation::Explanation;
use crate::core::model::Timestamp;

pub use kinds::{EventKind, Phase};

/// The capability (in a hello's `caps`) to answer `attribute` requests.
pub const CAP_ATTRIBUTION: &str = "attribution";
/// The capability to keep allocation history recording while an OOM is likely (`arm`).
pub const CAP_OOM_HISTORY: &str = "oom_history";

mod kinds;

/// The allocator counters and gauges the daemon uses, from `torch.cuda.memory_stats()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub allocated: Option<u64>,
    pub allocated_peak: Option<u64>,
    pub reserved: Option<u64>,
    pub active: Option<u64>,
    pub inactive_split: Option<u64>,
    pub requested: Option<u64>,
    pub alloc_retries: Option<u64>,
    pub ooms: Option<u64>,
    pub sync_all_streams: Option<u64>,
    pub device_alloc: Option<u64>,
    pub device_free: Option<u64>,
}

/// The share of reserved memory not allocated: the one definition of fragmentation.
pub fn unused_share(reserved: u64, allocated: u64) -> f64 {
    if reserved == 0 {
        0.0
    } else {
        reserved.saturating_sub(allocated) as f64 / reserved as f64
    }
}

impl Stats {
    /// (reserved − allocated) / reserved now: gpumon_trainer_fragmentation_ratio and the TUI's
    /// FRAG column. None without both numbers or with nothing reserved.
    pub fn fragmentation(&self) -> Option<f64> {
        match (self.reserved?, self.allocated?) {
            (0, _) => None,
            (r, a) => Some(unused_share(r, a)),
        }
    }

    /// The same share at the step's peak, reserved − peak allocated (what the fragmentation
    /// detector judges: at a step boundary the cache rightly holds the activations just freed),
    /// with those bytes; `inactive_split` stands in when no peak is sent.
    pub fn fragmentation_at_peak(&self) -> Option<(f64, u64)> {
        let reserved = self.reserved?;
        let unusable = match (self.allocated_peak, self.inactive_split) {
            (Some(peak), _) => reserved.saturating_sub(peak),
            (None, Some(split)) => split.min(reserved),
            (None, None) => return None,
        };
        Some((unused_share(reserved, reserved - unusable), unusable))
    }
}

/// `Default` is for building one in tests and benches (`v` 0 is no version the daemon speaks).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hello {
    pub v: u64,
    pub ns_pid: Option<u64>,
    pub job: Option<String>,
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub cuda_device: Option<u64>,
    pub gpu_uuid: Option<String>,
    pub client: Option<String>,
    pub torch: Option<String>,
    pub allocator: Option<String>,
    pub expandable_segments: Option<bool>,
    /// `PYTORCH_CUDA_ALLOC_CONF` as the client read it at attach (cache_growth's hint).
    pub alloc_conf: Option<String>,
    /// The caching allocator's cap (`set_per_process_memory_fraction`), when one is set.
    pub alloc_limit: Option<u64>,
    /// What the client can do when asked (`attribution`); unknown names are kept, unused.
    pub caps: Vec<String>,
    /// The client's own id for its lifetime, the same on every connection it opens: with
    /// `seq`, it lets the daemon drop lines a reconnecting client sends again.
    pub instance: Option<String>,
    /// The run this rank belongs to, the same on every rank of one run (jobs.md).
    pub run_id: Option<String>,
    /// torchelastic's restart count (`TORCHELASTIC_RESTART_COUNT`): a rise is the job going on.
    pub restart: Option<u64>,
}

impl Hello {
    /// Whether the client said it can do `cap` when asked.
    pub fn can(&self, cap: &str) -> bool {
        self.caps.iter().any(|c| c == cap)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub ts: f64,
    pub step: Option<u64>,
    /// Train when absent.
    pub phase: Phase,
    pub stats: Stats,
    pub device_free: Option<u64>,
    pub device_total: Option<u64>,
    /// Sent when the allocator's cap first becomes known or changes.
    pub alloc_limit: Option<u64>,
    /// Where the step's memory went, on the rare step the client measured it. Boxed: most
    /// samples carry none.
    pub categories: Option<Box<crate::core::categories::Categories>>,
}

impl Sample {
    /// What the caching allocator could hold at most at this sample: what it has reserved plus
    /// what the device has free, and never more than `alloc_limit`, its cap (the session's
    /// latest). Falls back to the device total (or the cap) when the trainer does not send
    /// `device_free`. The one definition: near_limit, the batch fit and a job member's
    /// headroom all read it.
    pub fn allocator_limit(&self, alloc_limit: Option<u64>) -> Option<u64> {
        let device = match (self.device_free, self.stats.reserved) {
            (Some(f), Some(r)) => Some(f.saturating_add(r)),
            _ => self.device_total,
        };
        match (device, alloc_limit) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub ts: f64,
    pub kind: EventKind,
    pub alloc_bytes: Option<u64>,
    pub device_free: Option<u64>,
    /// On `oom`: the most the allocator was allowed to hold (the cap, else the device total).
    pub alloc_limit: Option<u64>,
    pub phase: Option<Phase>,
    pub detail: Option<String>,
    pub path: Option<String>,
    /// Lines the client dropped before this one because the daemon could not take them
    /// (unreachable, or reading too slowly); the reference client says so on a `mark`.
    pub dropped: Option<u64>,
    /// On `oom`: what the trainer read in its allocator (pattern, lines, live sites). Boxed:
    /// most events carry none, and it is large.
    pub explanation: Option<Box<Explanation>>,
    /// How the trainer's process is ending, when the client said (`ending` on a `mark`).
    pub ending: Option<Exit>,
}

/// How a trainer's process said it is ending, short of a clean `bye`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It received this signal (`SIGTERM`): it was stopped, whatever its handler does next.
    Signal(String),
    /// It is dying of an uncaught exception: its type and message (`RuntimeError: boom`).
    Exception(String),
}

/// What older clients send when dying of an exception: `trainer died: <Type>: <message>`.
pub const DIED_PREFIX: &str = "trainer died: ";

impl Exit {
    /// The exit an event says: its `ending`, else an older client's `trainer died:` mark.
    pub fn of(e: &Event) -> Option<Exit> {
        if let Some(x) = &e.ending {
            return Some(x.clone());
        }
        let d = e.detail.as_deref()?.strip_prefix(DIED_PREFIX)?;
        (e.kind == EventKind::Mark).then(|| Exit::Exception(d.to_string()))
    }
}

/// Who is on the other end, from SO_PEERCRED (the kernel), never from the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// One step-boundary sample, compact: what charts and detectors read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SessionPoint {
    pub step: Option<u64>,
    pub train: bool,
    pub allocated: Option<u64>,
    pub allocated_peak: Option<u64>,
    pub reserved: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub ts: Timestamp,
    pub kind: EventKind,
    pub detail: Option<String>,
    pub alloc_bytes: Option<u64>,
    pub device_free: Option<u64>,
    /// The allocator's cap at the time: the event's own, else the latest the session reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_limit: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// `bye` received.
    Clean,
    /// The connection closed without `bye`: the trainer died.
    Crash,
    /// The connection closed without `bye` after the trainer said it received a signal: it
    /// was stopped (Ctrl-C, `timeout`, scancel, preemption), not failed.
    Stopped,
}

#[cfg(test)]
mod tests;
