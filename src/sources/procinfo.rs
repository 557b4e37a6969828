//! Who a GPU process is, from /proc: name, user, and the container or job it runs in.
//!
//! Looked up once per pid and cached, failed look-ups included (a pid in another PID namespace
//! fails every time; retrying each second would be wasted syscalls). The cache is pruned to the
//! pids of the latest collection, so it stays bounded and a reused pid is looked up afresh once
//! the old process has left NVML's list. Readings share the cached info (`Arc`): a poll costs
//! no allocation per process for it. Whether a cached process still runs is asked again every
//! `RECHECK` (liveness.rs): a process that exited while NVML lists its memory is orphaned.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::model::{ProcInfo, ProcState, ProcView};
use crate::util::pid_map::PidMap;
use pool::Pool;

pub struct ProcCache {
    /// Where /proc is (tests use a directory of their own).
    root: PathBuf,
    entries: PidMap<Entry>,
    users: Option<HashMap<u32, String>>,
    /// The current collection (`begin`).
    round: u64,
    /// Reads the files of a pid `get` finds not read ahead.
    reader: Reader,
    /// The threads `prefetch` reads on beside the caller, from the first prefetch on (their
    /// number found once: std reads the cgroup's CPU quota each time it is asked).
    pool: Option<Pool>,
    /// Files read ahead by `prefetch`, for `get` to finish.
    read_ahead: HashMap<u32, Files>,
    /// When the current collection began: one clock read a collection, not one a process.
    now: Instant,
    /// How often a cached process is asked whether it still runs.
    recheck: Duration,
    /// Rechecks left in the current collection (`RECHECKS_PER_COLLECTION`).
    rechecks: u32,
    /// A pid's turn to be rechecked comes in collections whose number plus the pid has these
    /// bits clear (every 2^n collections), so that the budget goes round every process (in
    /// NVML's order, the first ones would take it each time). A mask: this is asked of every
    /// process at every poll.
    turns: u32,
    /// Processes last asked before this are due (`now - recheck`).
    cutoff: Option<Instant>,
    /// Which processes `root` shows, found at the first ask.
    view: Option<ProcView>,
}

/// A cached pid: its info, the collection that last asked for it, when /proc was last asked
/// whether it runs, and its start time, read at the first look (a reused pid starts later).
struct Entry {
    info: Arc<ProcInfo>,
    seen: u64,
    probed: Instant,
    start: Option<u64>,
}

/// How often a listed process is asked again whether it still runs: a read of its stat file.
/// Orphaned memory is judged over a minute's grace, which 10 s more delay does not change.
pub const RECHECK: Duration = Duration::from_secs(10);
/// Rechecks a collection makes at most: a stat read costs 5-10 µs, so a poll spends at most
/// about 0.3 ms on them, and all that fall due at once make no burst. Past 32 processes they
/// take turns, each every 2^n collections for the least 2^n >= processes / 32 (1,000
/// processes: each every 32 s at a poll a second).
const RECHECKS_PER_COLLECTION: u32 = 32;

/// What a process's /proc files said, worked out as far as the reading thread can (all but
/// the user name, which needs the cache's passwd table).
#[derive(Default)]
struct Files {
    name: Option<String>,
    uid: Option<u32>,
    cgroup: Option<String>,
    container: Option<String>,
    pod_uid: Option<String>,
    /// Gone when status could not be read.
    state: Option<ProcState>,
    /// A zombie's parent and its name.
    ppid: Option<u32>,
    parent: Option<String>,
    /// The start time from stat, read at the first look: a pid that exits and is taken by
    /// another process before the first recheck then reads as gone, not as the new process.
    start: Option<u64>,
}

/// Uncached pids from which `prefetch` reads in parallel: below this, threads cost more than
/// the reads (a few µs a file).
const PREFETCH_FROM: usize = 32;
/// Threads `prefetch` uses at most, the calling one included.
const PREFETCH_THREADS: usize = 4;

impl ProcCache {
    pub fn new() -> Self {
        Self::with_root("/proc".into())
    }

    /// `root` replaces /proc, for tests.
    pub fn with_root(root: PathBuf) -> Self {
        Self {
            entries: PidMap::default(),
            users: None,
            round: 0,
            reader: Reader::new(&root),
            root,
            pool: None,
            read_ahead: HashMap::new(),
            now: Instant::now(),
            recheck: RECHECK,
            rechecks: RECHECKS_PER_COLLECTION,
            turns: 0,
            cutoff: None,
            view: None,
        }
    }

    /// Asks a cached process whether it still runs every `recheck` (tests).
    pub fn with_recheck(mut self, recheck: Duration) -> Self {
        self.recheck = recheck;
        self
    }

    /// Which processes the /proc read shows (liveness.rs), found once.
    pub fn view(&mut self) -> ProcView {
        *self.view.get_or_insert_with(|| liveness::view(&self.root))
    }

    /// Starts a collection: pids not asked for from here to `end` are forgotten then.
    pub fn begin(&mut self) {
        self.round += 1;
        self.now = Instant::now();
        self.rechecks = RECHECKS_PER_COLLECTION;
        let cached = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        self.turns = cached
            .div_ceil(RECHECKS_PER_COLLECTION)
            .max(1)
            .next_power_of_two()
            - 1;
        self.cutoff = self.now.checked_sub(self.recheck);
    }

    /// Forgets pids no longer running on any GPU (not asked for since `begin`).
    pub fn end(&mut self) {
        let round = self.round;
        self.entries.retain(|_, e| e.seen == round);
        self.read_ahead.clear();
    }

    /// Reads the /proc files of those of `pids` not cached yet on a few threads at once, this
    /// one among them, for `get` to use: a node's first look (`status --direct`, a daemon's
    /// first poll) reads two files for each of up to thousands of processes, which is most of a
    /// one-shot's time. Later polls find nearly every pid cached and read nothing here.
    pub fn prefetch(&mut self, pids: impl Iterator<Item = u32>) {
        let missing: Vec<u32> = pids
            .filter(|p| !self.entries.contains_key(p) && !self.read_ahead.contains_key(p))
            .collect();
        if missing.len() < PREFETCH_FROM {
            return;
        }
        let pool = self.pool.get_or_insert_with(|| {
            let threads = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(PREFETCH_THREADS);
            Pool::new(threads - 1)
        });
        if pool.is_empty() {
            return;
        }
        let read = pool.read(&self.root, &mut self.reader, missing);
        self.read_ahead.extend(read);
    }

    /// Info for `pid`; `fallback_name` (e.g. NVML's own idea of the name) is used when /proc
    /// has none.
    pub fn get(
        &mut self,
        pid: u32,
        fallback_name: impl FnOnce() -> Option<String>,
    ) -> Arc<ProcInfo> {
        if let Some(e) = self.entries.get_mut(&pid) {
            e.seen = self.round;
            // Gone stays gone: a process that comes back under its pid is another one.
            let due = self.cutoff.is_some_and(|c| e.probed <= c)
                && (pid.wrapping_add(self.round as u32) & self.turns) == 0;
            if due && self.rechecks > 0 && e.info.state != Some(ProcState::Gone) {
                self.rechecks -= 1;
                e.probed = self.now;
                self.reader.recheck(pid, e);
            }
            return e.info.clone();
        }
        let (mut info, start) = self.lookup(pid);
        if info.name.is_none() {
            info.name = fallback_name();
        }
        let info = Arc::new(info);
        self.entries.insert(
            pid,
            Entry {
                info: info.clone(),
                seen: self.round,
                probed: self.now,
                start,
            },
        );
        info
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The process's info and its start time (None when stat could not be read).
    fn lookup(&mut self, pid: u32) -> (ProcInfo, Option<u64>) {
        let files = match self.read_ahead.remove(&pid) {
            Some(f) => f,
            None => self.reader.files(pid),
        };
        let Files {
            name,
            uid,
            cgroup,
            container,
            pod_uid,
            state,
            ppid,
            parent,
            start,
        } = files;
        let user = uid.and_then(|u| self.user_name(u));
        let info = ProcInfo {
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
            state,
            ppid,
            parent,
        };
        (info, start)
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

/// Reads processes' /proc files, keeping its path and text buffers from one file to the next.
struct Reader {
    /// `root/`, followed while a file is read by `PID/FILE`.
    path: Vec<u8>,
    root_len: usize,
    buf: Vec<u8>,
}

/// What a /proc file is read into at first: status, the largest read, is about 1.5 KiB.
const SCRATCH: usize = 8 * 1024;
/// A file is cut here (procfs files are far below it).
const MAX_FILE: usize = 1 << 20;

impl Reader {
    fn new(root: &Path) -> Self {
        let mut path = root.as_os_str().as_bytes().to_vec();
        if !path.is_empty() && !path.ends_with(b"/") {
            path.push(b'/');
        }
        Self {
            root_len: path.len(),
            path,
            buf: vec![0; SCRATCH],
        }
    }

    /// A process's name and real uid (both from status), start time (stat) and main cgroup;
    /// None for each that cannot be read. status's `Name:` line is what comm holds (escaped), so comm is not read:
    /// a third of the files, and procfs costs a few µs per file opened.
    fn files(&mut self, pid: u32) -> Files {
        let (name, uid, (state, ppid)) = match self.read(pid, "status") {
            Some(status) => (
                status_name(status),
                parse_uid(status),
                liveness::from_status(status),
            ),
            None => (None, None, (ProcState::Gone, None)),
        };
        let (ppid, parent) = self.parent(state, ppid);
        // At the first look, not the first recheck: a pid reused in between is then told apart.
        let start = self
            .read(pid, "stat")
            .and_then(liveness::parse_stat)
            .map(|s| s.start);
        let cgroup = self.read(pid, "cgroup").and_then(main_cgroup);
        let container = cgroup.as_deref().and_then(container_from_cgroup);
        let pod_uid = cgroup.as_deref().and_then(kube_ids).map(|k| k.pod_uid);
        Files {
            name,
            uid,
            cgroup,
            container,
            pod_uid,
            state: Some(state),
            ppid,
            parent,
            start,
        }
    }

    /// `root/PID/file` as text; None when it cannot be read or is not UTF-8.
    fn read(&mut self, pid: u32, file: &str) -> Option<&str> {
        self.path.truncate(self.root_len);
        push_decimal(&mut self.path, pid);
        self.path.push(b'/');
        self.path.extend_from_slice(file.as_bytes());
        let len = read_small(Path::new(OsStr::from_bytes(&self.path)), &mut self.buf)?;
        std::str::from_utf8(&self.buf[..len]).ok()
    }
}

fn push_decimal(out: &mut Vec<u8>, n: u32) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Reads a small file into `buf` (grown as needed, its length kept between calls) and returns
/// how many bytes it holds; None when it cannot be read. procfs gives its files no size, so
/// std's size look-up (a statx per file) and its read to a zero-length end buy nothing: procfs
/// hands a file shown in one piece (status, cgroup, comm: `single_open`) whole to the first
/// read that has room for it, as a regular file does, so a read that leaves room is the end.
fn read_small(path: &Path, buf: &mut Vec<u8>) -> Option<usize> {
    let mut file = fs::File::open(path).ok()?;
    let mut len = 0;
    loop {
        if len == buf.len() {
            if len >= MAX_FILE {
                return Some(len);
            }
            buf.resize((len * 2).max(SCRATCH), 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => return Some(len),
            Ok(n) => {
                len += n;
                if len < buf.len() {
                    return Some(len);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// The line of a /proc status text that starts with `key` (e.g. `Uid:`), key included.
fn status_line<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    let mut from = 0;
    loop {
        let at = from + status[from..].find(key)?;
        if at == 0 || status.as_bytes()[at - 1] == b'\n' {
            let line = &status[at..];
            return Some(line.split('\n').next().unwrap_or(line));
        }
        // `key` is ASCII, so this is a character boundary.
        from = at + key.len();
    }
}

/// The process's name from status's `Name:` line, as comm holds it: the kernel writes the
/// name there with `\` and newline escaped (`\\`, `\n`) and all else as it is. Trailing
/// whitespace is dropped, as from comm's own line; None when empty.
fn status_name(status: &str) -> Option<String> {
    let line = status_line(status, "Name:")?;
    let escaped = line["Name:".len()..]
        .strip_prefix('\t')
        .unwrap_or(&line["Name:".len()..]);
    let mut name = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            name.push(c);
            continue;
        }
        match chars.clone().next() {
            Some('n') => {
                chars.next();
                name.push('\n');
            }
            Some('\\') => {
                chars.next();
                name.push('\\');
            }
            _ => name.push('\\'),
        }
    }
    name.truncate(name.trim_end().len());
    (!name.is_empty()).then_some(name)
}

/// The real uid from the `Uid:` line of /proc/PID/status.
fn parse_uid(status: &str) -> Option<u32> {
    status_line(status, "Uid:")?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
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
    // The best path so far, with its depth.
    let mut best: Option<(&str, usize)> = None;
    for line in lines(cgroup) {
        // `id:controllers:path`; a line without both colons makes the whole file unreadable.
        let (id, rest) = split_at(line, b':')?;
        let (_ctrl, path) = split_at(rest, b':')?;
        if path == "/" {
            continue;
        }
        if id == "0" {
            best = Some((path, 0));
            break;
        }
        let depth = path.bytes().filter(|&b| b == b'/').count();
        if best.is_none_or(|(_, d)| depth > d) {
            best = Some((path, depth));
        }
    }
    best.map(|(path, _)| path.to_string())
}

/// `text.lines()`, a byte at a time: a /proc file's short lines cost std's searcher more to
/// set up than to scan.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match split_at(rest, b'\n') {
            Some((line, after)) => {
                rest = after;
                Some(line.strip_suffix('\r').unwrap_or(line))
            }
            None => Some(std::mem::take(&mut rest)),
        }
    })
}

/// `s.split_once(byte)` for an ASCII `byte`, a byte at a time.
fn split_at(s: &str, byte: u8) -> Option<(&str, &str)> {
    let at = s.bytes().position(|b| b == byte)?;
    Some((&s[..at], &s[at + 1..]))
}

/// Container id (first 12 hex digits, as docker shows it), else Kubernetes pod uid, else Slurm
/// job, from a cgroup path. Runtimes spell these differently:
/// `/docker/<id>`, `/system.slice/docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>`,
/// `libpod-<id>.scope`, `/kubepods/burstable/pod<uid>/<id>`, `/slurm/uid_1000/job_42/step_0`.
pub fn container_from_cgroup(path: &str) -> Option<String> {
    // Most processes are in no container: a path too short for an id and naming no pod or job
    // is looked at no further.
    let id_fits = path.len() >= 64;
    if !id_fits && !path.contains("pod") && !path.contains("job_") {
        return None;
    }
    for segment in path.rsplit('/').take_while(|_| id_fits) {
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
    if !path.contains("pod") {
        return None;
    }
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

mod liveness;
mod pool;
#[cfg(test)]
mod tests;
