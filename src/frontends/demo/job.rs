//! The demo's job: `demo-ddp`, four ranks of one data-parallel run (one `run_id`, world size
//! 4) sharing GPU 0 with the single trainers there. Healthy at first; `FAIL_AT` seconds in, rank 2
//! draws the longest sequence of the epoch and its step asks for more than GPU 0 has left: an
//! OOM it does not survive (the `oom` event, then the process dies without bye), and torchrun
//! takes the other three down 1-2 s later (they exit without bye). Its life is on the demo's
//! clock like every trainer's: `--skip` moves into it, and a demo that starts after rank 2's
//! OOM has no job.

pub mod rank;

use serde_json::{json, Value};

use super::profile::{human, singles_free, CONTEXT, GIB, MIB, STEPS_PER_SECOND, TOTAL};
use crate::core::trainer::Stats;

pub const JOB: &str = "demo-ddp";

/// Free memory a trainer on `gpu` sees at `t` (what `mem_get_info` would say), the job's ranks
/// counted while they live.
pub fn device_free(gpu: usize, t: f64) -> u64 {
    singles_free(gpu, t).saturating_sub(used_on(gpu, t))
}
pub const WORLD_SIZE: u64 = 4;
/// The rank that runs out of memory.
pub const FAILING_RANK: u64 = 2;
/// Seconds after the demo's start when rank 2 runs out of memory.
pub const FAIL_AT: f64 = 75.0;
/// The simulated GPU every rank runs on.
pub const GPU: usize = 0;
/// What rank 2's failing step asks for: the attention of its longest sequence.
pub const ALLOC_BYTES: u64 = 16 << 30;
/// The client keeps this much of the exception's text (gpumon_client.client._excepthook).
const MAX_DIED: usize = 300;

/// Seconds after rank 2's OOM at which `rank` goes down: torchrun tears the run down.
pub fn down_after(rank: u64) -> f64 {
    match rank {
        FAILING_RANK => 0.0,
        0 => 1.2,
        1 => 1.5,
        _ => 1.8,
    }
}

/// When (seconds since the demo started) `rank` ends.
pub fn end(rank: u64) -> f64 {
    FAIL_AT + down_after(rank)
}

/// Whether a demo that starts `skip` seconds in runs the job: only before its failure.
pub fn launched(skip: f64) -> bool {
    skip < FAIL_AT
}

/// The run's id, as torchrun's rendezvous would give it: one per demo.
pub fn run_id(t0: f64) -> String {
    let mixed = (t0 * 1000.0) as u64 ^ (u64::from(std::process::id()) << 20);
    format!("ddp-{:06x}", mixed & 0xff_ffff)
}

/// The allocator's reserve of `rank`: rank 2's shard holds the longest sequences.
fn reserved(rank: u64) -> f64 {
    if rank == FAILING_RANK {
        5.0 * GIB
    } else {
        4.0 * GIB
    }
}

/// The allocator's stats of `rank` at `t` seconds (the run started at 0; every rank steps
/// together), and the step.
pub fn at(rank: u64, t: f64) -> (u64, Stats) {
    let step = (t.max(0.0) * STEPS_PER_SECOND) as u64;
    let jitter = ((step.wrapping_mul(2_654_435_761) >> 7) % 32) as f64 * MIB;
    let floor = 2.0 * GIB + jitter;
    let activations = if rank == FAILING_RANK { 2.5 } else { 1.5 } * GIB;
    let peak = floor + activations;
    let reserved = reserved(rank);
    let stats = Stats {
        allocated: Some(floor as u64),
        allocated_peak: Some(peak as u64),
        reserved: Some(reserved as u64),
        active: Some(floor as u64),
        inactive_split: Some(((reserved - peak).max(0.0) * 0.3) as u64),
        requested: Some((floor * 0.995) as u64),
        alloc_retries: Some(0),
        ooms: Some(0),
        ..Stats::default()
    };
    (step, stats)
}

/// What NVML shows for `rank`'s process: its reserve and the CUDA context.
pub fn nvml_used(rank: u64) -> u64 {
    (reserved(rank) + CONTEXT) as u64
}

/// What the job's live ranks hold on `gpu` at `t`.
pub fn used_on(gpu: usize, t: f64) -> u64 {
    if gpu != GPU || t < 0.0 {
        return 0;
    }
    (0..WORLD_SIZE).filter(|r| t < end(*r)).map(nvml_used).sum()
}

/// The instant of rank 2's failing step: a microsecond before the OOM.
fn last_instant() -> f64 {
    FAIL_AT - 1e-6
}

/// Rank 2's `oom` event, sent at `ts`, with the free memory its last step saw.
pub fn oom_event(ts: f64) -> Value {
    json!({
        "type": "event", "ts": ts, "kind": "oom", "alloc_bytes": ALLOC_BYTES,
        "device_free": device_free(GPU, last_instant()), "alloc_limit": TOTAL,
        "detail": format!("CUDA out of memory on device 0. Tried to allocate {} ({} allowed)",
            human(ALLOC_BYTES), human(TOTAL)),
    })
}

/// Why rank 2's process died: the uncaught OutOfMemoryError as the client quotes it.
pub fn exception() -> String {
    let (_, stats) = at(FAILING_RANK, last_instant());
    let allocated = stats.allocated_peak.unwrap_or(0);
    let reserved = stats.reserved.unwrap_or(0);
    let mut text = format!(
        "OutOfMemoryError: CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of {} of which {} is free. Including non-PyTorch memory, this process has {} memory in use. Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.",
        human(ALLOC_BYTES),
        human(TOTAL),
        human(device_free(GPU, last_instant())),
        human(nvml_used(FAILING_RANK)),
        human(allocated),
        human(reserved.saturating_sub(allocated)),
    );
    // Every character above is ASCII, so any byte index is a char boundary.
    text.truncate(MAX_DIED);
    text
}

#[cfg(test)]
mod tests;
