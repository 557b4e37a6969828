//! Unified-memory GPUs (docs/operations.md, "Unified memory"): which GPUs share the host's
//! memory, and the host figures their memory total was built from. No series without one.

use crate::core::model::NodeReading;
use crate::util::family::Family;

const GPU: &[&str] = &["gpu", "uuid"];

pub fn unified_families(r: &NodeReading, out: &mut String) {
    let mut info = Family::gauge(
        "gpumon_gpu_unified_memory_info",
        "1 for a GPU that shares the host's memory (NVML has no frame-buffer total for it): its memory series are its processes' sum and the host's limit.",
        GPU,
    );
    let mut available = Family::gauge(
        "gpumon_gpu_unified_host_available_bytes",
        "The host's MemAvailable in bytes, read for a unified-memory GPU's limit.",
        GPU,
    );
    let mut headroom = Family::gauge(
        "gpumon_gpu_unified_cgroup_headroom_bytes",
        "The least memory limit minus usage in bytes (cgroup v2 memory.max, else v1 memory.limit_in_bytes) over the cgroups of a unified-memory GPU's processes, where one sets a limit.",
        GPU,
    );
    for g in &r.gpus {
        let Some(u) = &g.unified else { continue };
        let gpu = g.identity.index.to_string();
        let l = [gpu.as_str(), g.identity.uuid.as_str()];
        info.add(&l, 1.0);
        if let Some(b) = u.host_available {
            available.add(&l, b as f64);
        }
        if let Some(b) = u.cgroup_headroom {
            headroom.add(&l, b as f64);
        }
    }
    info.finish(out);
    available.finish(out);
    headroom.finish(out);
}
