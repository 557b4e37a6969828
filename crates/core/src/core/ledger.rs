//! A trainer's memory on its GPU, accounted: NVML's per-process "used" (what nvidia-smi shows)
//! = live tensors (allocated) + what the caching allocator holds free (cached: reserved −
//! allocated) + what lies outside the allocator (NVML used − reserved: the CUDA context, NCCL,
//! cuBLAS and cuDNN workspaces, raw cudaMalloc). Only the two sources gpumon holds at once can
//! say the last part. A part that cannot be known is left out with the reason, never guessed.

use serde::{Deserialize, Serialize};

use super::model::Timestamp;
use super::trainer::Stats;

/// A sample and a poll further apart than this make no pair: each figure moved since.
pub const MAX_AGE_SECONDS: f64 = 60.0;
/// Reserved above NVML's figure by more than this is not a moment's skew between the two.
const SKEW_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// NVML's per-process used memory on this GPU.
    pub nvml_used_bytes: Option<u64>,
    /// Live tensors (allocated_bytes.all.current).
    pub allocated_bytes: Option<u64>,
    /// Held by the caching allocator but not allocated (reserved − allocated).
    pub cached_bytes: Option<u64>,
    /// Of the cached bytes, those in split blocks (inactive_split_bytes): fragmentation's share.
    pub cached_fragmented_bytes: Option<u64>,
    /// NVML used − reserved: memory of this process outside PyTorch's caching allocator.
    pub outside_allocator_bytes: Option<u64>,
    /// How far apart the allocator's sample and NVML's poll were taken.
    pub age_seconds: Option<f64>,
    /// Why a part is missing, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

/// What the ledger is made from.
pub struct Inputs<'a> {
    pub nvml_used: Option<u64>,
    pub poll_ts: Option<Timestamp>,
    pub stats: Option<&'a Stats>,
    pub sample_ts: Option<Timestamp>,
    /// Live sessions of this process on this GPU, this one included.
    pub sessions_sharing: usize,
}

pub fn ledger(i: &Inputs) -> Ledger {
    let allocated = i.stats.and_then(|s| s.allocated);
    let reserved = i.stats.and_then(|s| s.reserved);
    let mut l = Ledger {
        nvml_used_bytes: i.nvml_used,
        allocated_bytes: allocated,
        cached_bytes: reserved.zip(allocated).map(|(r, a)| r.saturating_sub(a)),
        cached_fragmented_bytes: i.stats.and_then(|s| s.inactive_split),
        outside_allocator_bytes: None,
        age_seconds: i.poll_ts.zip(i.sample_ts).map(|(p, s)| (p - s).abs()),
        unknown: None,
    };
    let why = match (i.nvml_used, reserved) {
        (None, _) => Some(
            "NVML gives no per-process figure for this process on this GPU (not polled yet, not listed, or MPS)".to_string(),
        ),
        (_, None) => Some("the trainer has sent no reserved_bytes.all.current yet".into()),
        _ if i.sessions_sharing > 1 => Some(format!(
            "{} trainer sessions share this process on this GPU: NVML's figure is theirs together",
            i.sessions_sharing
        )),
        _ if l.age_seconds.is_some_and(|a| a > MAX_AGE_SECONDS) => Some(format!(
            "the allocator's last sample and NVML's last poll are {:.0} s apart",
            l.age_seconds.unwrap_or_default()
        )),
        (Some(used), Some(r)) if r > used.saturating_add(SKEW_BYTES) => Some(format!(
            "the allocator reserves more than NVML counts for the process ({r} > {used} bytes): another device's memory, or expandable segments mapped differently"
        )),
        (Some(used), Some(r)) => {
            l.outside_allocator_bytes = Some(used.saturating_sub(r));
            None
        }
    };
    l.unknown = why;
    l
}

#[cfg(test)]
mod tests;
