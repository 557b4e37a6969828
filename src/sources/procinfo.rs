//! Who a GPU process is, from /proc: name, user, and the container or job it runs in.
//!
//! Looked up once per pid and cached, failed look-ups included (a pid in another PID namespace
//! fails every time; retrying each second would be wasted syscalls). The cache is pruned to the
//! pids of the latest collection, so it stays bounded and a reused pid is looked up afresh once
//! the old process has left NVML's list. Readings share the cached info (`Arc`): a poll costs
//! no allocation per process for it.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::core::model::ProcInfo;
use crate::util::pid_map::PidMap;

pub struct ProcCache {
    root: PathBuf,
    /// Info by pid, with the collection that last asked for it.
    entries: PidMap<(Arc<ProcInfo>, u64)>,
    users: Option<HashMap<u32, String>>,
    /// The current collection (`begin`).
    round: u64,
    /// Where a /proc file is read, kept between look-ups.
    scratch: String,
    /// Files read ahead by `prefetch`, for `get` to finish.
    read_ahead: HashMap<u32, Files>,
}

/// What a process's /proc files said, before the user name and container are worked out.
#[derive(Default)]
struct Files {
    name: Option<String>,
    uid: Option<u32>,
    cgroup: Option<String>,
}

/// Uncached pids from which `prefetch` reads in parallel: below this, threads cost more than
/// the reads (a few µs a file).
const PREFETCH_FROM: usize = 32;
/// Threads `prefetch` uses at most.
const PREFETCH_THREADS: usize = 4;

impl ProcCache {
    pub fn new() -> Self {
        Self::with_root("/proc".into())
    }

    /// `root` replaces /proc, for tests.
    pub fn with_root(root: PathBuf) -> Self {
        Self {
            root,
            entries: PidMap::default(),
            users: None,
            round: 0,
            scratch: String::with_capacity(SCRATCH),
            read_ahead: HashMap::new(),
        }
    }

    /// Starts a collection: pids not asked for from here to `end` are forgotten then.
    pub fn begin(&mut self) {
        self.round += 1;
    }

    /// Forgets pids no longer running on any GPU (not asked for since `begin`).
    pub fn end(&mut self) {
        let round = self.round;
        self.entries.retain(|_, (_, seen)| *seen == round);
        self.read_ahead.clear();
    }

    /// Reads the /proc files of those of `pids` not cached yet on a few threads at once, for
    /// `get` to use: a node's first look (`status --direct`, a daemon's first poll) reads three
    /// files for each of up to thousands of processes, which is most of a one-shot's time.
    /// Later polls find nearly every pid cached and read nothing here.
    pub fn prefetch(&mut self, pids: impl Iterator<Item = u32>) {
        let missing: Vec<u32> = pids
            .filter(|p| self.entries.get_mut(p).is_none() && !self.read_ahead.contains_key(p))
            .collect();
        if missing.len() < PREFETCH_FROM {
            return;
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(PREFETCH_THREADS);
        if threads < 2 {
            return;
        }
        let per = missing.len().div_ceil(threads);
        let root = &self.root;
        let read: Vec<(u32, Files)> = std::thread::scope(|scope| {
            let parts: Vec<_> = missing
                .chunks(per)
                .map(|part| {
                    scope.spawn(move || {
                        let mut buf = String::with_capacity(SCRATCH);
                        part.iter()
                            .map(|&pid| (pid, read_files(root, pid, &mut buf)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            // A reader that panicked leaves its pids to `get`, which reads them itself.
            parts
                .into_iter()
                .filter_map(|h| h.join().ok())
                .flatten()
                .collect()
        });
        self.read_ahead.extend(read);
    }

    /// Info for `pid`; `fallback_name` (e.g. NVML's own idea of the name) is used when /proc
    /// has none.
    pub fn get(
        &mut self,
        pid: u32,
        fallback_name: impl FnOnce() -> Option<String>,
    ) -> Arc<ProcInfo> {
        if let Some((info, seen)) = self.entries.get_mut(&pid) {
            *seen = self.round;
            return info.clone();
        }
        let mut info = self.lookup(pid);
        if info.name.is_none() {
            info.name = fallback_name();
        }
        let info = Arc::new(info);
        self.entries.insert(pid, (info.clone(), self.round));
        info
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn lookup(&mut self, pid: u32) -> ProcInfo {
        let files = match self.read_ahead.remove(&pid) {
            Some(f) => f,
            None => {
                let mut buf = std::mem::take(&mut self.scratch);
                let f = read_files(&self.root, pid, &mut buf);
                self.scratch = buf;
                f
            }
        };
        let Files { name, uid, cgroup } = files;
        let user = uid.and_then(|u| self.user_name(u));
        let container = cgroup.as_deref().and_then(container_from_cgroup);
        let pod_uid = cgroup.as_deref().and_then(kube_ids).map(|k| k.pod_uid);
        ProcInfo {
            name,
            user,
            uid,
            container,
            cgroup,
            // The UID until the kubelet names it (sources::kubelet), or for good without one.
            pod: pod_uid.clone(),
            pod_uid,
            namespace: None,
            container_name: None,
        }
    }

    fn user_name(&mut self, uid: u32) -> Option<String> {
        let users = self.users.get_or_insert_with(|| {
            fs::read_to_string("/etc/passwd")
                .map(|s| parse_passwd(&s))
                .unwrap_or_default()
        });
        Some(users.get(&uid).cloned().unwrap_or_else(|| uid.to_string()))
    }
}

impl Default for ProcCache {
    fn default() -> Self {
        Self::new()
    }
}

/// A process's name (comm), real uid (status) and main cgroup; None for each that cannot be read.
fn read_files(root: &Path, pid: u32, buf: &mut String) -> Files {
    let dir = root.join(pid.to_string());
    let name = read_small(&dir.join("comm"), buf)
        .then(|| buf.trim_end().to_string())
        .filter(|s| !s.is_empty());
    let uid = read_small(&dir.join("status"), buf)
        .then(|| parse_uid(buf))
        .flatten();
    let cgroup = read_small(&dir.join("cgroup"), buf)
        .then(|| main_cgroup(buf))
        .flatten();
    Files { name, uid, cgroup }
}

/// What a /proc file is read into: status, the largest read, is about 1.5 KiB.
const SCRATCH: usize = 8 * 1024;

/// Reads a small file into `buf` (cleared first); false when it cannot be read. procfs gives
/// its files no size, so std's size look-up (a statx per file) and its growing reads buy
/// nothing: with `buf`'s room kept between calls, a file is one read and the end one more.
fn read_small(path: &Path, buf: &mut String) -> bool {
    buf.clear();
    let Ok(file) = fs::File::open(path) else {
        return false;
    };
    // `take` hides the File, so the size look-up is skipped; procfs files are far below it.
    file.take(1 << 20).read_to_string(buf).is_ok()
}

/// The real uid from the `Uid:` line of /proc/PID/status.
fn parse_uid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn parse_passwd(passwd: &str) -> HashMap<u32, String> {
    passwd
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let uid = f.nth(1)?.parse().ok()?;
            Some((uid, name.to_string()))
        })
        .collect()
}

/// The cgroup path that names the process's container: the v2 unified line (`0::/...`), else the
/// v1 line with the most path components (the controllers often disagree; the deepest is the
/// most specific). On a hybrid host the unified line is often just `/` while the v1 lines name
/// the container (a cgroupfs-driver kubelet), so a root v2 line does not win.
fn main_cgroup(cgroup: &str) -> Option<String> {
    let mut best: Option<&str> = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, _ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        if path == "/" {
            continue;
        }
        if id == "0" {
            best = Some(path);
            break;
        }
        if best.is_none_or(|b| path.matches('/').count() > b.matches('/').count()) {
            best = Some(path);
        }
    }
    best.map(str::to_string)
}

/// Container id (first 12 hex digits, as docker shows it), else Kubernetes pod uid, else Slurm
/// job, from a cgroup path. Runtimes spell these differently:
/// `/docker/<id>`, `/system.slice/docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>`,
/// `libpod-<id>.scope`, `/kubepods/burstable/pod<uid>/<id>`, `/slurm/uid_1000/job_42/step_0`.
pub fn container_from_cgroup(path: &str) -> Option<String> {
    for segment in path.rsplit('/') {
        let stem = segment.strip_suffix(".scope").unwrap_or(segment);
        let id = stem.rsplit(['-', ':']).next().unwrap_or(stem);
        if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some(id[..12].to_string());
        }
    }
    for segment in path.split('/') {
        let seg = segment.strip_suffix(".slice").unwrap_or(segment);
        if let Some(pod) = seg.rsplit('-').next().and_then(|s| s.strip_prefix("pod")) {
            if pod.len() >= 32 {
                return Some(format!("pod{}", pod.replace('_', "-")));
            }
        }
        if let Some(job) = segment.strip_prefix("job_") {
            return Some(format!("slurm-job-{job}"));
        }
    }
    None
}

/// A Kubernetes pod's UID and, when the path goes down to one, its container's full id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeIds {
    /// With dashes, as the API spells it (the systemd driver writes underscores).
    pub pod_uid: String,
    /// 64 hex digits, as the kubelet's `containerID` has it after `<runtime>://`.
    pub container_id: Option<String>,
}

/// The pod UID and container id in a kubelet-made cgroup path, for either cgroup driver:
/// systemd `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
/// cri-containerd-<id>.scope` (or `crio-`, `docker-`) and cgroupfs `/kubepods/burstable/pod<uid>/
/// <id>`. Paths seen through a cgroup namespace (`/../..`) parse the same. None outside a pod.
pub fn kube_ids(path: &str) -> Option<KubeIds> {
    let mut segments = path.split('/');
    let pod_uid = segments.by_ref().find_map(pod_segment)?;
    let container_id = segments.next().and_then(|seg| {
        let stem = seg.strip_suffix(".scope").unwrap_or(seg);
        let id = stem.rsplit(['-', ':']).next().unwrap_or(stem);
        (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
    });
    Some(KubeIds {
        pod_uid,
        container_id,
    })
}

/// `pod<uid>` of a kubepods path segment: `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid>.slice`
/// (systemd). A UID is 32 hex digits with or without dashes (static pods have a bare hash).
fn pod_segment(segment: &str) -> Option<String> {
    let uid = match segment.strip_suffix(".slice") {
        // systemd writes the UID's dashes as underscores, so the last `-` starts `pod`.
        Some(stem) if stem.starts_with("kubepods") => stem.rsplit('-').next()?,
        Some(_) => return None,
        None => segment,
    };
    let uid = uid.strip_prefix("pod")?.replace('_', "-");
    let hex = uid.bytes().filter(u8::is_ascii_hexdigit).count();
    (hex == 32 && uid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())).then_some(uid)
}

/// What is wrong with `root` as the /proc to read: `Err` when it is not a directory at all
/// (every process would lose its user and container without a word), `Ok(Some(warning))` when it
/// exists but holds no proc filesystem (no `stat`), `Ok(None)` when it looks right.
pub fn check_root(root: &std::path::Path) -> Result<Option<String>, String> {
    if !root.is_dir() {
        return Err(format!(
            "{} is not a directory; point it at the host's /proc (e.g. /host/proc in a container)",
            root.display()
        ));
    }
    if !root.join("stat").is_file() {
        return Ok(Some(format!(
            "{} does not look like a proc filesystem (no {}): GPU processes will have no user or container",
            root.display(),
            root.join("stat").display()
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
