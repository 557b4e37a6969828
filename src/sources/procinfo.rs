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
mod tests {
    use super::*;

    #[test]
    fn a_missing_procfs_is_an_error_and_an_empty_one_a_warning() {
        assert_eq!(check_root(std::path::Path::new("/proc")), Ok(None));
        let dir = tempfile::tempdir().unwrap();
        let warning = check_root(dir.path()).unwrap().unwrap();
        assert!(
            warning.contains(&dir.path().display().to_string()),
            "{warning}"
        );
        let missing = dir.path().join("absent");
        let err = check_root(&missing).unwrap_err();
        assert!(err.contains(&missing.display().to_string()), "{err}");
    }

    const ID: &str = "3f4e1b2c9d8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e";

    #[test]
    fn container_ids_from_each_runtime() {
        let cases = [
            format!("/docker/{ID}"),
            format!("/system.slice/docker-{ID}.scope"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-{ID}.scope"),
            format!("/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/{ID}"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
            format!("/crio-{ID}"),
        ];
        for c in &cases {
            assert_eq!(container_from_cgroup(c).as_deref(), Some(&ID[..12]), "{c}");
        }
    }

    #[test]
    fn pods_and_slurm_jobs_without_container_id() {
        assert_eq!(
            container_from_cgroup(
                "/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"
            )
            .as_deref(),
            Some("pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
        );
        assert_eq!(
            container_from_cgroup("/slurm/uid_1000/job_4242/step_0/task_0").as_deref(),
            Some("slurm-job-4242")
        );
        assert_eq!(
            container_from_cgroup("/user.slice/user-1000.slice/session-3.scope"),
            None
        );
    }

    #[test]
    fn pod_uid_and_container_id_for_each_driver_and_runtime() {
        let uid = "2358e669-61e0-11e9-bc12-02f121c1eeb4";
        let u_ = uid.replace('-', "_");
        let want = |id: Option<&str>| {
            Some(KubeIds {
                pod_uid: uid.into(),
                container_id: id.map(str::to_string),
            })
        };
        let cases = [
            // cgroup v2, systemd driver (kubeadm's default), containerd, burstable QoS.
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u_}.slice/cri-containerd-{ID}.scope"),
            // Guaranteed QoS has no QoS level in the path.
            format!("/kubepods.slice/kubepods-pod{u_}.slice/crio-{ID}.scope"),
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u_}.slice/docker-{ID}.scope"),
            // cgroupfs driver (v1 and v2).
            format!("/kubepods/burstable/pod{uid}/{ID}"),
            format!("/kubepods/pod{uid}/{ID}"),
            // Read from inside a cgroup namespace: relative to the reader's own cgroup.
            format!("/../../kubepods-besteffort-pod{u_}.slice/cri-containerd-{ID}.scope"),
        ];
        for c in &cases {
            assert_eq!(kube_ids(c), want(Some(ID)), "{c}");
        }
        // The pod's own slice (the pause container's parent, or a process between exec and
        // its container scope): a pod without a container.
        assert_eq!(
            kube_ids(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u_}.slice"
            )),
            want(None)
        );
        // A static pod's UID is the config hash, without dashes.
        assert_eq!(
            kube_ids(&format!(
                "/kubepods/burstable/pod5795d0c442cb997ff93c49feeb9f6386/{ID}"
            ))
            .map(|k| k.pod_uid)
            .as_deref(),
            Some("5795d0c442cb997ff93c49feeb9f6386")
        );
        for outside in [
            format!("/docker/{ID}"),
            format!("/system.slice/docker-{ID}.scope"),
            "/user.slice/user-1000.slice/session-3.scope".to_string(),
            // Not a kubepods slice, even if named like a pod.
            "/system.slice/podman-pod0f1e2d3c4b5a69788796a5b4c3d2e1f0.slice".to_string(),
        ] {
            assert_eq!(kube_ids(&outside), None, "{outside}");
        }
    }

    #[test]
    fn a_pod_process_is_labelled_with_its_uid_until_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("9");
        fs::create_dir(&p).unwrap();
        fs::write(
            p.join("cgroup"),
            format!("0::/kubepods/besteffort/pod7760601b-65a6-11e9-bc12-02f121c1eeb4/{ID}\n"),
        )
        .unwrap();
        let info = ProcCache::with_root(dir.path().into()).get(9, || None);
        let uid = "7760601b-65a6-11e9-bc12-02f121c1eeb4";
        assert_eq!(info.pod_uid.as_deref(), Some(uid));
        assert_eq!(info.pod.as_deref(), Some(uid));
        assert_eq!(info.namespace, None);
        assert_eq!(info.container.as_deref(), Some(&ID[..12]));
    }

    #[test]
    fn v2_line_wins_and_root_is_no_cgroup() {
        let v1v2 = "12:memory:/docker/abc\n0::/system.slice/ssh.service\n";
        assert_eq!(
            main_cgroup(v1v2).as_deref(),
            Some("/system.slice/ssh.service")
        );
        assert_eq!(main_cgroup("0::/\n"), None);
        let hybrid = "4:memory:/kubepods/pod1/abc\n1:name=systemd:/kubepods/pod1/abc\n0::/\n";
        assert_eq!(main_cgroup(hybrid).as_deref(), Some("/kubepods/pod1/abc"));
    }

    #[test]
    fn reads_a_fake_proc_tree_and_caches_failures() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("77");
        fs::create_dir(&p).unwrap();
        fs::write(p.join("comm"), "python\n").unwrap();
        fs::write(p.join("status"), "Name:\tpython\nUid:\t0\t0\t0\t0\n").unwrap();
        fs::write(p.join("cgroup"), format!("0::/docker/{ID}\n")).unwrap();
        let mut cache = ProcCache::with_root(dir.path().into());
        cache.begin();
        let info = cache.get(77, || None);
        assert_eq!(info.name.as_deref(), Some("python"));
        assert_eq!(info.uid, Some(0));
        assert_eq!(info.user.as_deref(), Some("root"));
        assert_eq!(info.container.as_deref(), Some(&ID[..12]));

        let missing = cache.get(78, || Some("from-nvml".into()));
        assert_eq!(missing.name.as_deref(), Some("from-nvml"));
        // Cached: the fallback is not consulted again.
        let again = cache.get(78, || panic!("looked up twice"));
        assert_eq!(again, missing);
        cache.end();
        // The next collection sees only 77: 78 is forgotten, 77 is not looked up again.
        cache.begin();
        assert!(Arc::ptr_eq(&cache.get(77, || None), &info));
        cache.end();
        assert_eq!(cache.len(), 1);
    }

    /// Read ahead on threads or one by one, a process's info is the same; pids /proc lacks
    /// still take NVML's name.
    #[test]
    fn prefetched_info_is_what_get_reads_alone() {
        let dir = tempfile::tempdir().unwrap();
        for pid in 1000..1100u32 {
            let p = dir.path().join(pid.to_string());
            fs::create_dir(&p).unwrap();
            fs::write(p.join("comm"), format!("worker{pid}\n")).unwrap();
            fs::write(
                p.join("status"),
                format!("Name:\tw\nUid:\t{pid}\t0\t0\t0\n"),
            )
            .unwrap();
            fs::write(p.join("cgroup"), format!("0::/docker/{ID}\n")).unwrap();
        }
        let pids = || (990..1100u32).chain([5000]);
        let mut alone = ProcCache::with_root(dir.path().into());
        let mut ahead = ProcCache::with_root(dir.path().into());
        alone.begin();
        ahead.begin();
        ahead.prefetch(pids());
        for pid in pids() {
            let fallback = || Some(format!("nvml{pid}"));
            assert_eq!(
                ahead.get(pid, fallback),
                alone.get(pid, fallback),
                "pid {pid}"
            );
        }
        assert_eq!(ahead.get(1042, || None).uid, Some(1042));
        assert_eq!(ahead.get(5000, || None).name.as_deref(), Some("nvml5000"));
        ahead.end();
        assert!(ahead.read_ahead.is_empty());
        assert_eq!(ahead.len(), 111);
    }
}
