//! `gpumon status`'s legend: what each column and abbreviation of the tables above means, for
//! the tables that were printed, so that no word is left to guess (RESERVED means two things).

use std::fmt::Write as _;

use crate::core::snapshot::Snapshot;

/// The legend of the GPU table, always printed.
const GPUS: &[(&str, &str)] = &[
    ("USED", "memory NVML counts as used on the GPU"),
    (
        "RESERVED",
        "in the GPU table: memory the driver and firmware keep back, not PyTorch's",
    ),
];

/// Printed when a GPU is unified (its memory is the host's).
const UNIFIED: &[(&str, &str)] = &[(
    "unified",
    "the GPU shares the host's memory: USED is the sum of its processes' memory as NVML gives it; TOTAL is that plus what the allocator can still get, the host's MemAvailable (host_available) or a cgroup's memory limit less its usage when lower (cgroup_max)",
)];

const JOBS: &[(&str, &str)] = &[(
    "RANKS",
    "ranks this daemon sees / the run's world size (? when none was sent)",
)];

const TRAINERS: &[(&str, &str)] = &[
    (
        "RANK",
        "rank/world size; - for a process that sent no rank",
    ),
    (
        "ALLOCATED",
        "memory PyTorch's tensors hold (torch.cuda.memory_allocated)",
    ),
    (
        "RESERVED",
        "in the trainer table: what PyTorch's caching allocator holds, allocated and cached",
    ),
    (
        "OUTSIDE",
        "the process's NVML memory minus RESERVED: outside PyTorch (CUDA context, NCCL, other allocators); ? when it cannot be known, and why on the line below",
    ),
    (
        "FINDINGS",
        "open findings, each its kind and state (pending: not yet confirmed; firing)",
    ),
];

const PROCESSES: &[(&str, &str)] = &[
    (
        "KIND",
        "how NVML lists the process: compute, graphics, both, or mps (an MPS client)",
    ),
    (
        "USED",
        "in the process table: the process's GPU memory, as NVML counts it",
    ),
    (
        "n/a, -",
        "not known (another pid namespace, or not reported)",
    ),
];

/// The legend, for the sections `layout` printed.
pub fn section(snap: &Snapshot, out: &mut String) {
    let jobs = snap.jobs.iter().any(super::jobs::listed);
    let trainers = snap.sessions.iter().any(|s| s.ended.is_none());
    let mut rows: Vec<&(&str, &str)> = GPUS.iter().collect();
    if snap.gpus.iter().any(|g| g.reading.unified.is_some()) {
        rows.extend(UNIFIED);
    }
    if jobs {
        rows.extend(JOBS);
    }
    if trainers {
        rows.extend(TRAINERS);
    }
    if !snap.processes.is_empty() {
        rows.extend(PROCESSES);
    }
    out.push_str("\nlegend\n");
    for (word, what) in rows {
        let _ = writeln!(out, "  {word:<10} {what}");
    }
}

/// The reason under a trainer's row whose OUTSIDE is `?`: what the API's ledger says, as the
/// TUI's trainer detail says it.
pub fn outside_unknown(s: &crate::core::snapshot::SessionView, out: &mut String) {
    let Some(l) = &s.ledger else { return };
    if l.outside_allocator_bytes.is_some() {
        return;
    }
    let why = l.unknown.as_deref().unwrap_or("not known");
    let _ = writeln!(out, "  outside the allocator: ? ({why})");
}

#[cfg(test)]
mod tests;
