//! An orphaned_memory finding in words: what holds the memory, what gpumon knew of the process,
//! and what to do about it.

use super::OrphanEvidence;
use crate::core::detect::findings::Subject;
use crate::core::detect::Evidence;
use crate::core::model::{ProcState, Timestamp};
use crate::units::{bytes, duration_coarse};

/// "GPU 3: 19.5 GiB held by pid 81234 (python), which exited 12m ago (zombie of pid 80001
/// (torchrun), job llama-ft rank 3, session s-…, container 3f4e1b2c9d8a)".
pub fn message(gpu: u32, pid: u32, who: &Subject, e: &Evidence, now: Timestamp) -> String {
    let Some(o) = e.orphan.as_deref() else {
        return format!("GPU {gpu}: memory held by pid {pid}, which has exited");
    };
    let held = o.bytes.map_or_else(|| "memory".to_string(), bytes);
    let mut m = format!("GPU {gpu}: {held} held by pid {pid}");
    if let Some(name) = &o.process {
        m.push_str(&format!(" ({name})"));
    }
    match o.exited_ts {
        Some(t) => m.push_str(&format!(", which exited {} ago", duration_coarse(now - t))),
        None => m.push_str(&format!(
            ", which exited at least {} ago",
            duration_coarse(now - o.gone_since)
        )),
    }
    let known = known(o, who);
    if !known.is_empty() {
        m.push_str(&format!(" ({})", known.join(", ")));
    }
    m
}

/// What gpumon knew: the zombie's parent, the trainer's job, rank and session, its container.
fn known(o: &OrphanEvidence, who: &Subject) -> Vec<String> {
    let mut parts = Vec::new();
    match (o.state, o.parent_pid) {
        (ProcState::Zombie, Some(ppid)) => parts.push(format!(
            "zombie of pid {ppid}{}",
            o.parent
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        )),
        (ProcState::Zombie, None) => parts.push("a zombie".into()),
        _ => parts.push("no such process left".into()),
    }
    match (&who.job, who.rank) {
        (Some(j), Some(r)) => parts.push(format!("job {j} rank {r}")),
        (Some(j), None) => parts.push(format!("job {j}")),
        (None, Some(r)) => parts.push(format!("rank {r}")),
        (None, None) => {}
    }
    if !who.session.is_empty() {
        parts.push(format!("session {}", who.session));
    }
    match (&o.pod, &o.namespace, &o.container) {
        (Some(pod), Some(ns), _) => parts.push(format!("pod {ns}/{pod}")),
        (Some(pod), None, _) => parts.push(format!("pod {pod}")),
        (None, _, Some(c)) => parts.push(format!("container {c}")),
        (None, _, None) => {}
    }
    if let Some(u) = &o.user {
        parts.push(format!("user {u}"));
    }
    parts
}

/// What to do: reap the zombie (its parent), else find what still holds the GPU, and reset it
/// once nothing does.
pub fn hint(gpu: u32, pid: u32, e: &Evidence) -> String {
    let reset = format!(
        "once no process holds it, `nvidia-smi --gpu-reset -i {gpu}` frees the memory (only while \
         nothing else runs on GPU {gpu}; otherwise drain the node and reboot)"
    );
    let holders = "a process that inherited its GPU context may hold it (a DataLoader worker or \
                   another child it forked): find what still has the GPU open with \
                   `fuser -v /dev/nvidia*` and end it";
    let o = e.orphan.as_deref();
    match o.map(|o| (o.state, o.parent_pid)) {
        Some((ProcState::Zombie, Some(ppid))) => format!(
            "pid {ppid}{} has not reaped its exited child {pid}: make it wait() for its \
             children, or end it (`kill {ppid}`) so that init reaps the zombie and the driver \
             frees the memory. If NVML still lists the memory after that, {holders}; {reset}",
            o.and_then(|o| o.parent.as_deref())
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ),
        Some((ProcState::Zombie, None)) => format!(
            "pid {pid} is a zombie: end its parent (`ps -o ppid= -p {pid}`) so that init reaps \
             it. If NVML still lists the memory after that, {holders}; {reset}"
        ),
        _ => format!(
            "pid {pid} has exited and been reaped, yet the driver still holds its memory: \
             {holders}; {reset}"
        ),
    }
}
