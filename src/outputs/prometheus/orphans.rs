//! Orphaned memory: the bytes NVML lists for each process that has exited, while its
//! orphaned_memory finding fires (detection.md). No series when none does.

use crate::core::store::Store;
use crate::util::family::Family;

pub fn orphan_families(store: &Store, out: &mut String) {
    let mut held = Family::gauge(
        "gpumon_orphaned_memory_bytes",
        "GPU memory in bytes NVML lists for a process that has exited (a zombie, or no process left) while its orphaned_memory finding fires.",
        &["gpu", "uuid", "pid"],
    );
    let mut rows: Vec<(u32, u32, &str, u64)> = store
        .orphans
        .current()
        .filter_map(|f| {
            let bytes = f.evidence.orphan.as_deref()?.bytes?;
            Some((f.gpu?, f.subject.pid, f.subject.gpu_uuid.as_deref()?, bytes))
        })
        .collect();
    // The tracker keeps them by hash: in GPU and pid order, as the process series are.
    rows.sort_unstable();
    for (gpu, pid, uuid, bytes) in rows {
        held.add(&[&gpu.to_string(), uuid, &pid.to_string()], bytes as f64);
    }
    held.finish(out);
}
