//! The recorder thread: owns every trace file, rotates parts, and keeps gpumon's files (open ones
//! included) under `max_total_bytes` and `max_files`: it deletes its own finished traces oldest
//! first, and when none is left it stops recording the session that would cross the cap. Ingest only hands it
//! chunks of lines, so neither disk I/O nor pruning ever runs on the aggregator's thread.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use super::index::Index;
use super::journal::{self, Journal};
use super::names::{self, Ident};
use super::stats::{Reason, RecordStats};
use crate::core::trace;

mod settings;
pub use settings::{InvalidRecord, RecordConfig};

/// Room kept per open session for the line that says its recording stopped, so that line never
/// takes the directory over its cap.
pub const MARKER_RESERVE: u64 = 256;

/// What the recorder keeps the directory under.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// A part past this size is closed and the session goes on in the next.
    pub file_bytes: u64,
    /// Bytes of gpumon's traces here, those being written included.
    pub total_bytes: u64,
    /// gpumon's trace files here, those being written included.
    pub files: usize,
}

impl Caps {
    /// Byte caps, with the default file cap.
    pub fn bytes(file_bytes: u64, total_bytes: u64) -> Self {
        Self {
            file_bytes,
            total_bytes,
            files: RecordConfig::default().max_files,
        }
    }
}

pub enum Msg {
    Open {
        id: u64,
        base: String,
        hello: Vec<u8>,
        stopped: Arc<AtomicBool>,
        durable: Arc<AtomicU64>,
    },
    /// Whole lines, each ending in a newline; `seq` the highest line number among them (0:
    /// none numbered).
    Data {
        id: u64,
        bytes: Vec<u8>,
        lines: u64,
        seq: u64,
    },
    /// The session ended; `Some` when ingest itself gave up recording it.
    Close {
        id: u64,
        reason: Option<Reason>,
    },
    Finish,
}

struct Open {
    base: String,
    hello: Vec<u8>,
    /// The hello's `instance`: the client's id across its connections.
    instance: Option<String>,
    part: u32,
    file: Option<(File, PathBuf, Ident)>,
    /// Bytes in the current part.
    written: u64,
    stopped: Arc<AtomicBool>,
    /// Raised to a chunk's `seq` once all of it is in the file (in the kernel's hands: a
    /// daemon killed after that loses none of it), so ingest acknowledges no line not on disk.
    durable: Arc<AtomicU64>,
}

pub struct Writer {
    dir: PathBuf,
    max_file: u64,
    max_total: u64,
    max_files: usize,
    stats: Arc<RecordStats>,
    open: HashMap<u64, Open>,
    /// gpumon's finished traces here, deletable when the directory needs room; oldest first.
    finished: Index,
    /// The parts open now, on disk, so that the next daemon can end them if this one is killed.
    journal: Journal,
    /// Bytes of all gpumon files here, open ones included.
    total: u64,
}

impl Writer {
    /// Takes over the directory: gpumon's traces from earlier runs become finished traces
    /// (oldest first); every other file is counted once in the log and never touched.
    pub fn new(dir: &Path, caps: Caps, stats: Arc<RecordStats>) -> std::io::Result<Self> {
        // First, so the traces a killed daemon left open are ended (and sized) before the scan.
        let (journal, _) = Journal::recover(dir);
        let mut earlier = Vec::new();
        let mut foreign = Vec::new();
        for e in std::fs::read_dir(dir)?.filter_map(Result::ok) {
            let path = e.path();
            if path.file_name().is_some_and(|n| {
                n == names::MARKER || n == journal::NAME || n == journal::REWRITTEN
            }) {
                continue;
            }
            match names::ours(&path) {
                Some(o) => earlier.push((o.modified, path, o.len, o.ident, o.instance)),
                None => foreign.push(path),
            }
        }
        if !foreign.is_empty() {
            let some: Vec<String> = foreign
                .iter()
                .take(5)
                .map(|p| p.display().to_string())
                .collect();
            tracing::info!(dir = %dir.display(), count = foreign.len(), first = ?some, "record dir: leaving alone files gpumon did not write (only gpumon-*.trace.jsonl traces are ever deleted)");
        }
        earlier.sort_by_key(|e| e.0);
        let mut finished = Index::default();
        let mut total = 0;
        for (_, path, len, ident, instance) in earlier {
            if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                finished.push(name, instance.as_deref(), len, ident);
                total += len;
            }
        }
        let w = Self {
            dir: dir.to_path_buf(),
            max_file: caps.file_bytes,
            max_total: caps.total_bytes,
            max_files: caps.files.max(1),
            stats,
            open: HashMap::new(),
            finished,
            journal,
            total,
        };
        w.publish();
        Ok(w)
    }

    pub fn run(mut self, rx: Receiver<Msg>) {
        // Earlier runs may have left more than the caps allow now.
        self.make_room(0, false);
        self.publish();
        while let Ok(msg) = rx.recv() {
            let started = std::time::Instant::now();
            match msg {
                Msg::Open {
                    id,
                    base,
                    hello,
                    stopped,
                    durable,
                } => self.open_session(id, base, hello, stopped, durable),
                Msg::Data {
                    id,
                    bytes,
                    lines,
                    seq,
                } => {
                    self.stats
                        .queued_bytes
                        .fetch_sub(bytes.len() as u64, Ordering::Relaxed);
                    self.data(id, &bytes, lines, seq);
                }
                Msg::Close { id, reason } => {
                    if let Some(r) = reason {
                        self.stop(id, r);
                    }
                    if let Some(s) = self.open.remove(&id) {
                        self.finish_part(s.file, s.instance.as_deref());
                        // Past max_files only while more were open at once than it allows.
                        self.make_room(0, false);
                    }
                }
                Msg::Finish => break,
            }
            self.publish();
            let ns = started.elapsed().as_nanos() as u64;
            self.stats.busy_ns.fetch_add(ns, Ordering::Relaxed);
        }
        for (_, s) in std::mem::take(&mut self.open) {
            self.finish_part(s.file, s.instance.as_deref());
        }
        self.journal.clean();
        self.publish();
    }

    fn publish(&self) {
        self.stats.bytes.store(self.total, Ordering::Relaxed);
        self.stats
            .files
            .store(self.files() as u64, Ordering::Relaxed);
    }

    fn reserve(&self) -> u64 {
        self.open.len() as u64 * MARKER_RESERVE
    }

    /// Files of gpumon's here, finished and being written.
    fn files(&self) -> usize {
        self.finished.len() + self.open.values().filter(|s| s.file.is_some()).count()
    }

    /// Deletes finished traces, oldest first, until `n` more bytes (and a new file, if
    /// `new_file`) fit; false when they cannot.
    fn make_room(&mut self, n: u64, new_file: bool) -> bool {
        loop {
            let over_bytes = self.total + self.reserve() + n > self.max_total;
            let over_files = self.files() + usize::from(new_file) > self.max_files;
            if !over_bytes && !over_files {
                return true;
            }
            let Some(old) = self.finished.pop_oldest() else {
                // Too many files open at once is no reason to stop recording: only bytes are.
                return !over_bytes;
            };
            self.total = self.total.saturating_sub(old.bytes);
            let path = self.dir.join(&old.name);
            // Deleted only if it is still the file gpumon wrote there (not replaced or a link).
            let same = std::fs::symlink_metadata(&path)
                .is_ok_and(|m| m.file_type().is_file() && Ident::of(&m) == old.ident);
            if !same {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    self.stats.deleted_files.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(file = %path.display(), "record dir at its cap (record.max_total_bytes, record.max_files): deleted the oldest finished trace");
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "cannot delete an old trace")
                }
            }
        }
    }

    fn open_session(
        &mut self,
        id: u64,
        base: String,
        hello: Vec<u8>,
        stopped: Arc<AtomicBool>,
        durable: Arc<AtomicU64>,
    ) {
        self.stats.sessions.fetch_add(1, Ordering::Relaxed);
        let first = hello.split(|c| *c == b'\n').next().unwrap_or_default();
        let instance = trace::hello_instance(first);
        self.open.insert(
            id,
            Open {
                base,
                hello,
                instance,
                part: 0,
                file: None,
                written: 0,
                stopped,
                durable,
            },
        );
        self.next_part(id);
    }

    /// Closes the session's current part (if any) and starts the next with the hello again.
    /// False when the session's recording stopped.
    fn next_part(&mut self, id: u64) -> bool {
        let Some(s) = self.open.get_mut(&id) else {
            return false;
        };
        let old = s.file.take();
        let (base, part, instance) = (s.base.clone(), s.part, s.instance.clone());
        s.part += 1;
        s.written = 0;
        let hello_len = s.hello.len() as u64 + 1;
        self.finish_part(old, instance.as_deref());
        // Found before this part exists, so it never names itself.
        let previous = match (&instance, part) {
            (Some(i), 0) => self.previous_trace(id, i),
            _ => None,
        };
        if !self.make_room(hello_len, true) {
            self.stop(id, Reason::OverCap);
            return false;
        }
        let mut n = 1;
        let created = loop {
            let path = self.dir.join(names::part_name(&base, part, n));
            // Readable too: a full disk has the tail read to find whole lines to give up.
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => n += 1,
                other => break other.map(|f| (f, path)),
            }
        };
        let (file, path) = match created {
            Ok(fp) => fp,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot create a trace file; this session is not recorded");
                self.failed(id, &e);
                return false;
            }
        };
        // Held while the part is written, released when its file closes: `gpumon analyze` reads
        // a locked trace as one still being written, not as a trainer that crashed.
        let _ = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive);
        if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
            self.journal.opened(name);
        }
        let ident = file
            .metadata()
            .map(|m| Ident::of(&m))
            .unwrap_or(Ident { dev: 0, ino: 0 });
        if let Some(s) = self.open.get_mut(&id) {
            s.file = Some((file, path, ident));
            let hello = std::mem::take(&mut s.hello);
            let mut line = hello.clone();
            line.push(b'\n');
            s.hello = hello;
            if let Some(p) = previous {
                line.extend_from_slice(&trace::resumes_line(&p, now_seconds()));
            }
            return self.append(id, &line);
        }
        false
    }

    /// The trace the client `instance` wrote last, other than session `id`'s: an open one (a
    /// reconnect before the old connection closed) before the finished ones.
    fn previous_trace(&self, id: u64, instance: &str) -> Option<String> {
        let open = self
            .open
            .iter()
            .filter(|(k, s)| **k != id && s.instance.as_deref() == Some(instance))
            .max_by_key(|(k, _)| **k)
            .and_then(|(_, s)| s.file.as_ref())
            .and_then(|(_, p, _)| p.file_name()?.to_str().map(str::to_owned));
        open.or_else(|| self.finished.newest_of(instance))
    }

    fn finish_part(&mut self, file: Option<(File, PathBuf, Ident)>, instance: Option<&str>) {
        if let Some((f, path, ident)) = file {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                let open = self
                    .open
                    .values()
                    .filter_map(|s| s.file.as_ref()?.1.file_name()?.to_str());
                self.journal.closed(name, open);
                self.finished.push(name, instance, len, ident);
            }
        }
    }

    /// Writes `bytes` (whole lines) to the session's current part, accounting for them.
    fn append(&mut self, id: u64, bytes: &[u8]) -> bool {
        let Some(Some((f, _, _))) = self.open.get_mut(&id).map(|s| s.file.as_mut()) else {
            return false;
        };
        match f.write_all(bytes) {
            Ok(()) => {
                if let Some(s) = self.open.get_mut(&id) {
                    s.written += bytes.len() as u64;
                }
                self.total += bytes.len() as u64;
                true
            }
            Err(e) => {
                self.failed(id, &e);
                false
            }
        }
    }

    fn failed(&mut self, id: u64, e: &std::io::Error) {
        self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        let full = matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
        let reason = if full {
            Reason::DiskFull
        } else {
            Reason::WriteError
        };
        tracing::warn!(error = %e, reason = reason.as_str(), "trace write failed");
        self.stop(id, reason);
    }

    fn data(&mut self, id: u64, mut bytes: &[u8], mut lines: u64, seq: u64) {
        let Some(s) = self.open.get(&id) else { return };
        if s.stopped.load(Ordering::Relaxed) {
            self.stats.dropped_lines.fetch_add(lines, Ordering::Relaxed);
            return;
        }
        while !bytes.is_empty() {
            let Some(s) = self.open.get(&id) else { return };
            let hello_len = s.hello.len() as u64 + 1;
            // As many whole lines as fit in this part; at least one, so a line longer than a
            // part still goes into a part of its own.
            let room = self.max_file.saturating_sub(s.written) as usize;
            let (take, n) = fit(bytes, room);
            if take == 0 && s.written > hello_len {
                if !self.next_part(id) {
                    self.stats.dropped_lines.fetch_add(lines, Ordering::Relaxed);
                    return;
                }
                continue;
            }
            let (take, n) = if take == 0 {
                let end = bytes
                    .iter()
                    .position(|c| *c == b'\n')
                    .map_or(bytes.len(), |i| i + 1);
                (end, 1)
            } else {
                (take, n)
            };
            let chunk = &bytes[..take];
            if !self.make_room(chunk.len() as u64, false) {
                self.stop(id, Reason::OverCap);
                self.stats.dropped_lines.fetch_add(lines, Ordering::Relaxed);
                return;
            }
            if !self.append(id, chunk) {
                self.stats.dropped_lines.fetch_add(lines, Ordering::Relaxed);
                return;
            }
            bytes = &bytes[take..];
            lines = lines.saturating_sub(n);
        }
        if let Some(s) = self.open.get(&id) {
            s.durable.fetch_max(seq, Ordering::Relaxed);
        }
    }

    /// Ends recording of a session before its end, with a last line saying why (room for it
    /// was reserved), and tells ingest to stop handing its lines over.
    fn stop(&mut self, id: u64, reason: Reason) {
        let Some(s) = self.open.get_mut(&id) else {
            return;
        };
        if s.stopped.swap(true, Ordering::Relaxed) && s.file.is_none() {
            return;
        }
        self.stats.stop(reason);
        let written = s.written;
        let file = s.file.take();
        let base = s.base.clone();
        let instance = s.instance.clone();
        let hint = match reason {
            Reason::OverCap => "the record dir holds record.max_total_bytes in traces still being written: raise record.max_total_bytes or lower record.max_file_bytes",
            Reason::DiskFull => "the disk holding the record dir is full",
            Reason::WriteError => "the record dir cannot be written",
            Reason::QueueFull => "the record dir's disk is slower than ingest",
        };
        tracing::warn!(trace = %base, reason = reason.as_str(), hint, "recording of this session stopped; the session itself goes on");
        if let Some((mut f, path, ident)) = file {
            // A failed write may have left part of a line: cut back to the last whole line.
            truncate_to(&mut f, written);
            let marker = stop_line(reason);
            let mut kept = written;
            if f.write_all(&marker).is_err() {
                // The disk is full: give up the last lines for room, so that the trace says it
                // was cut rather than reading as a trainer that crashed. Shrinking frees whole
                // blocks, so at least a block's worth of lines goes.
                kept = cut_back(&mut f, written, FREED_FOR_MARKER).unwrap_or(written);
                truncate_to(&mut f, kept);
                if f.write_all(&marker).is_err() {
                    truncate_to(&mut f, kept);
                    tracing::warn!(trace = %base, "no room even for the line that says the trace was cut");
                }
            }
            let now = f.metadata().map(|m| m.len()).unwrap_or(kept);
            self.total = (self.total + now).saturating_sub(written);
            self.finish_part(Some((f, path, ident)), instance.as_deref());
        }
    }
}

/// Bytes of lines given up, at least, when a full disk leaves no room for the stop line: more
/// than a filesystem block, so that the cut frees one.
const FREED_FOR_MARKER: u64 = 8192;

/// Cuts `f` to `len` bytes and puts the write position there (the file is not in append mode).
fn truncate_to(f: &mut File, len: u64) {
    use std::io::{Seek, SeekFrom};
    let _ = f.set_len(len);
    let _ = f.seek(SeekFrom::Start(len));
}

/// Where to cut a file of `len` bytes so that at least `need` bytes of whole lines come off its
/// end: just after the last newline at or before `len - need`, never into the first line (the
/// hello). None when there is no such place. Reads only the file's tail.
pub(super) fn cut_back(f: &mut File, len: u64, need: u64) -> Option<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let limit = len.checked_sub(need)?;
    let window = limit.min(1 << 16);
    let from = limit - window;
    let mut tail = vec![0u8; window as usize];
    f.seek(SeekFrom::Start(from)).ok()?;
    f.read_exact(&mut tail).ok()?;
    let i = tail.iter().rposition(|c| *c == b'\n')?;
    Some(from + i as u64 + 1)
}

/// The last line of a trace whose recording stopped before the session ended.
pub fn stop_line(reason: Reason) -> Vec<u8> {
    crate::core::trace::truncated_line(reason.as_str(), crate::core::model::now())
}

/// Bytes of the whole lines at the start of `b` that fit in `room`, and how many lines.
fn fit(b: &[u8], room: usize) -> (usize, u64) {
    let lines = |b: &[u8]| b.iter().filter(|c| **c == b'\n').count() as u64;
    if b.len() <= room {
        return (b.len(), lines(b));
    }
    match b[..room].iter().rposition(|c| *c == b'\n') {
        Some(i) => (i + 1, lines(&b[..=i])),
        None => (0, 0),
    }
}

/// Now, as the Unix seconds trace lines carry.
fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
