//! `gpumon status`'s orphaned memory: memory NVML lists for processes that have exited, each
//! finding's message and what to do about it, and a line when the daemon cannot tell (its /proc
//! holds none of NVML's pids). Strings come escaped: `table` escapes the snapshot first.

use std::fmt::Write as _;

use crate::core::detect::orphan::HostPids;
use crate::core::detect::Kind;
use crate::core::snapshot::Snapshot;

/// The section, when memory is orphaned or cannot be judged.
pub fn section(snap: &Snapshot, out: &mut String) {
    if snap.host_pids == Some(HostPids::Hidden) {
        let _ = writeln!(
            out,
            "\norphaned memory not judged: none of the processes NVML lists is in /proc (a container without hostPID? mount the host's /proc and set procfs)"
        );
    }
    let open: Vec<_> = snap
        .findings
        .iter()
        .filter(|f| f.kind == Kind::OrphanedMemory && f.state.open())
        .collect();
    if open.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nORPHANED MEMORY (NVML lists it for processes that have exited)"
    );
    for f in open {
        let _ = writeln!(out, "  {}", f.message);
        if let Some(h) = &f.hint {
            let _ = writeln!(out, "    what to do: {h}");
        }
    }
}

#[cfg(test)]
mod tests;
