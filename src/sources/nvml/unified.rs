//! A unified-memory device's memory (GB10 and the like: NVML answers "Not Supported" for the
//! frame buffer but lists each process's memory). Its used memory is what NVML gives per process;
//! what the trainers' allocator can still get comes from the host: /proc/meminfo's MemAvailable,
//! or a cgroup's memory limit that leaves less (a container's limit binds its allocations): v2's
//! `memory.max`, else, on a host with cgroup v1's memory controller (older Jetson and HPC
//! images), its `memory.limit_in_bytes`.

use std::path::{Path, PathBuf};

use crate::core::model::UnifiedMemory;

/// Where cgroup v2 is mounted, and v1's controllers below it (`memory/`), as systemd mounts them.
/// In a container with its own cgroup namespace this shows the container's cgroup as the root,
/// whose limit is the container's.
pub const CGROUPFS: &str = "/sys/fs/cgroup";

/// Where one cgroup version keeps a memory limit and the usage it bounds.
pub struct Layout {
    /// The hierarchy's directory below the cgroup mount.
    pub under: &'static str,
    pub limit: &'static str,
    pub usage: &'static str,
}

pub const V2: Layout = Layout {
    under: "",
    limit: "memory.max",
    usage: "memory.current",
};

pub const V1: Layout = Layout {
    under: "memory",
    limit: "memory.limit_in_bytes",
    usage: "memory.usage_in_bytes",
};

/// At or past this a v1 limit is "none" (unlimited reads 9223372036854771712, LONG_MAX rounded
/// down to a page).
const V1_UNLIMITED: u64 = 1 << 62;

/// Reads the host's figures for a unified device.
#[derive(Debug, Clone)]
pub struct HostMemory {
    pub procfs: PathBuf,
    pub cgroupfs: PathBuf,
}

impl HostMemory {
    /// The figures for a device whose processes are `pids`, using `processes_used` bytes
    /// together (None: NVML gave some process's memory as "n/a"). With no processes no cgroup
    /// binds: the daemon's own is no guide to where a trainer will start (a service's slice, or
    /// in a container the daemon's own limit), so the host's MemAvailable does.
    pub fn read(&self, pids: &[u32], processes_used: Option<u64>) -> UnifiedMemory {
        let host_available = std::fs::read_to_string(self.procfs.join("meminfo"))
            .ok()
            .and_then(|m| mem_available(&m));
        let cgroup_headroom = pids
            .iter()
            .filter_map(|pid| {
                let file = self.procfs.join(pid.to_string()).join("cgroup");
                let text = std::fs::read_to_string(file).ok()?;
                // A hybrid host lists a v2 path too, with no memory files under it: v1's
                // memory controller is then the one that binds.
                v2_path(&text)
                    .and_then(|p| headroom(&self.cgroupfs, p, &V2))
                    .or_else(|| headroom(&self.cgroupfs, v1_memory_path(&text)?, &V1))
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

/// The path of the v1 memory controller's cgroup (`N:memory:/path`, the controller possibly
/// listed with others); None where v1's memory controller is not mounted.
pub fn v1_memory_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| {
        let mut fields = l.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })
}

/// The least limit less usage over `path` and its ancestors in `layout`'s hierarchy under
/// `root` that set a limit (v2's "max" and v1's unlimited set none); None when none does or
/// none can be read.
///
/// None too for a path that climbs above the root (`/../../x`): read from inside a cgroup
/// namespace (the daemon in a container), the cgroup lies outside the daemon's own, which is
/// all this view shows; the root's limit there is the daemon container's, not the process's.
pub fn headroom(root: &Path, path: &str, layout: &Layout) -> Option<u64> {
    if path.split('/').any(|p| p == "..") {
        return None;
    }
    let mut dir = root.join(layout.under);
    let mut least = limit_left(&dir, layout);
    for part in path.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
        least = match (least, limit_left(&dir, layout)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    least
}

fn limit_left(dir: &Path, layout: &Layout) -> Option<u64> {
    let read = |file: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let limit = read(layout.limit).filter(|&l| l < V1_UNLIMITED)?;
    // Without the usage the room left is unknown: that level is skipped, not guessed.
    let usage = read(layout.usage)?;
    Some(limit.saturating_sub(usage))
}

#[cfg(test)]
mod tests;
