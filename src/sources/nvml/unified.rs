//! A unified-memory device's memory (GB10 and the like: NVML answers "Not Supported" for the
//! frame buffer but lists each process's memory). Its used memory is what NVML gives per process;
//! what the trainers' allocator can still get comes from the host: /proc/meminfo's MemAvailable,
//! or a cgroup v2 `memory.max` that leaves less (a container's limit binds its allocations).

use std::path::{Path, PathBuf};

use crate::core::model::UnifiedMemory;

/// Where cgroup v2 is mounted. In a container with its own cgroup namespace this shows the
/// container's cgroup as the root, whose `memory.max` is the container's limit.
pub const CGROUPFS: &str = "/sys/fs/cgroup";

/// Reads the host's figures for a unified device.
#[derive(Debug, Clone)]
pub struct HostMemory {
    pub procfs: PathBuf,
    pub cgroupfs: PathBuf,
}

impl HostMemory {
    /// The figures for a device whose processes are `pids`, using `processes_used` bytes
    /// together (None: NVML gave some process's memory as "n/a"). With no processes, the
    /// daemon's own cgroup stands in: what starts next most likely starts beside it.
    pub fn read(&self, pids: &[u32], processes_used: Option<u64>) -> UnifiedMemory {
        let host_available = std::fs::read_to_string(self.procfs.join("meminfo"))
            .ok()
            .and_then(|m| mem_available(&m));
        let files: Vec<PathBuf> = if pids.is_empty() {
            vec![PathBuf::from("/proc/self/cgroup")]
        } else {
            pids.iter()
                .map(|p| self.procfs.join(p.to_string()).join("cgroup"))
                .collect()
        };
        let cgroup_headroom = files
            .iter()
            .filter_map(|file| {
                let text = std::fs::read_to_string(file).ok()?;
                headroom(&self.cgroupfs, v2_path(&text)?)
            })
            .min();
        let mut u = UnifiedMemory {
            processes_used,
            host_available,
            cgroup_headroom,
            limit_from: None,
        };
        u.limit_from = u.bound();
        u
    }
}

/// MemAvailable from /proc/meminfo's text, in bytes (the file says kB, meaning KiB).
pub fn mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// The cgroup v2 path in /proc/PID/cgroup's text (its `0::` line); None on a v1-only host.
pub fn v2_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The least `memory.max - memory.current` over `path` and its ancestors under `root` that set
/// a limit ("max" sets none); None when none does or none can be read.
pub fn headroom(root: &Path, path: &str) -> Option<u64> {
    let mut dir = root.to_path_buf();
    let mut least = limit_left(&dir);
    for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
        dir.push(part);
        least = match (least, limit_left(&dir)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    least
}

fn limit_left(dir: &Path) -> Option<u64> {
    let max: u64 = std::fs::read_to_string(dir.join("memory.max"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // Without the usage the room left is unknown: that level is skipped, not guessed.
    let current: u64 = std::fs::read_to_string(dir.join("memory.current"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(max.saturating_sub(current))
}

#[cfg(test)]
mod tests;
