//! `--record-dir`: each session's accepted lines, as received, in a trace file of its own (hello
//! first), so `gpumon analyze` can replay it later. A file past `max_file_bytes` is closed and a
//! new part begins with the hello again (every part is a valid trace).
//!
//! The directory is shared with nobody's data: gpumon deletes only files it names
//! `gpumon-*.trace.jsonl` that begin with a hello (names.rs), and keeps the bytes and the
//! number of those, files being written included, under `max_total_bytes` and `max_files`
//! (writer.rs).
//!
//! The recorder is ingest's tap (`core::tap`): ingest only appends a line to the trace's buffer
//! (on the connection's task: a copy, nothing more) and hands full buffers to the recorder
//! thread, which owns the files. Lines wait at most
//! a second (or until 64 KiB) in the buffer while the trainer is sending; the rest goes when
//! the session ends. A recorder thread behind by more than `MAX_QUEUED` stops recording the
//! session whose chunk does not fit, counted, rather than growing memory.

mod health;
mod index;
mod journal;
mod names;
pub mod stats;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::tap::{SessionTap, Tap};
use crate::core::trace;
pub use stats::{Reason, RecordStats};
pub use writer::{Caps, InvalidRecord, RecordConfig};
use writer::{Msg, Writer};

/// A trace's buffer goes to the recorder thread at this size...
const CHUNK: usize = 64 * 1024;
/// ...or when this long has passed since it last did.
const LINGER: Duration = Duration::from_secs(1);
/// Bytes handed over but not yet written, across all sessions.
const MAX_QUEUED: u64 = 32 << 20;

pub struct Recorder {
    dir: PathBuf,
    /// The node's name, in every trace's header (`trace_host`); none: no such line.
    host: Option<String>,
    tx: Sender<Msg>,
    next_id: AtomicU64,
    stats: Arc<RecordStats>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// One session's trace being written.
pub struct Trace {
    tx: Sender<Msg>,
    stats: Arc<RecordStats>,
    id: u64,
    path: PathBuf,
    buf: Vec<u8>,
    /// The size of the last buffer handed over: the next one starts with about that much room.
    last_len: usize,
    lines: u64,
    sent: Instant,
    /// Set by the recorder thread (or here) once this session's recording stopped.
    stopped: Arc<AtomicBool>,
    /// The highest `seq` among lines in `buf`, and the highest the recorder has written.
    seq: u64,
    durable: Arc<AtomicU64>,
    /// Set here when a chunk did not fit in the queue.
    queue_full: bool,
    dropped: u64,
}

impl Recorder {
    /// Takes over `dir` (absolute; created if missing) and starts the recorder thread, counting
    /// into `stats` (the daemon's, which /metrics reads). An error means the daemon runs
    /// without recording.
    pub fn new(dir: &Path, caps: Caps, stats: Arc<RecordStats>) -> std::io::Result<Arc<Self>> {
        Self::make(dir, caps, stats, None)
    }

    /// `new`, naming the host its traces say they were recorded on (`node_name`): the daemon's.
    pub fn on_host(
        dir: &Path,
        caps: Caps,
        stats: Arc<RecordStats>,
        host: String,
    ) -> std::io::Result<Arc<Self>> {
        Self::make(dir, caps, stats, Some(host))
    }

    fn make(
        dir: &Path,
        caps: Caps,
        stats: Arc<RecordStats>,
        host: Option<String>,
    ) -> std::io::Result<Arc<Self>> {
        if dir.as_os_str().is_empty() || !dir.is_absolute() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "record.dir must be an absolute path, got {:?}",
                    dir.display().to_string()
                ),
            ));
        }
        std::fs::create_dir_all(dir)?;
        // Proves the directory writable and says whose it is.
        std::fs::write(dir.join(names::MARKER), names::MARKER_TEXT)?;
        let writer = Writer::new(dir, caps, stats.clone())?;
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("gpumon-record".into())
            .spawn(move || writer.run(rx))?;
        stats.enabled.store(true, Ordering::Relaxed);
        Ok(Arc::new(Self {
            dir: dir.to_path_buf(),
            host,
            tx,
            next_id: AtomicU64::new(1),
            stats,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// Starts the trace of a session whose hello line was just accepted.
    pub fn start(
        &self,
        session: &str,
        job: Option<&str>,
        rank: Option<u64>,
        started: f64,
        hello: &[u8],
    ) -> Trace {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let base = names::base(started, session, job, rank);
        let stopped = Arc::new(AtomicBool::new(false));
        let durable = Arc::new(AtomicU64::new(0));
        let path = self.dir.join(names::part_name(&base, 0, 1));
        let _ = self.tx.send(Msg::Open {
            id,
            base,
            hello: match &self.host {
                Some(h) => [hello, b"\n", &trace::host_line(h, started)].concat(),
                None => hello.to_vec(),
            },
            stopped: stopped.clone(),
            durable: durable.clone(),
        });
        Trace {
            tx: self.tx.clone(),
            stats: self.stats.clone(),
            id,
            path,
            buf: Vec::new(),
            last_len: 0,
            lines: 0,
            sent: Instant::now(),
            stopped,
            seq: 0,
            durable,
            queue_full: false,
            dropped: 0,
        }
    }

    /// Writes out everything handed over so far and stops the thread (the daemon's shutdown,
    /// after every connection closed). Blocks until the files are written.
    pub fn finish(&self) {
        let _ = self.tx.send(Msg::Finish);
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::error!("the recorder thread panicked");
            }
        }
        self.stats.enabled.store(false, Ordering::Relaxed);
    }
}

impl Trace {
    /// The first part's file (the recorder adds `-2`… if that name was taken).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this session's lines still go to its trace (not stopped for a cap or an error).
    pub fn recording(&self) -> bool {
        !self.queue_full && !self.stopped.load(Ordering::Relaxed)
    }

    /// The highest `seq` whose line is in the file.
    pub fn durable(&self) -> u64 {
        self.durable.load(Ordering::Relaxed)
    }

    /// Appends one accepted line (without its newline), numbered `seq` by the client (0: not).
    pub fn write(&mut self, line: &[u8], seq: u64) {
        if !self.recording() {
            self.dropped += 1;
            return;
        }
        self.seq = self.seq.max(seq);
        if self.buf.capacity() == 0 {
            // Room for what the last second brought, not for a whole chunk: a trainer sending
            // a line a second fills a few hundred bytes of it, and 64 sessions each holding a
            // fresh 65 KiB buffer after every hand-off kept 2 MiB more resident.
            let want = self.last_len + self.last_len / 4 + line.len() + 1;
            self.buf.reserve(want.min(CHUNK + 1024));
        }
        self.buf.extend_from_slice(line);
        self.buf.push(b'\n');
        self.lines += 1;
        if self.buf.len() >= CHUNK || self.sent.elapsed() >= LINGER {
            self.send();
        }
    }

    fn send(&mut self) {
        self.sent = Instant::now();
        if self.buf.is_empty() {
            return;
        }
        let len = self.buf.len() as u64;
        let q = &self.stats.queued_bytes;
        if q.load(Ordering::Relaxed) + len > MAX_QUEUED {
            self.queue_full = true;
            self.dropped += self.lines;
            self.buf = Vec::new();
            self.lines = 0;
            return;
        }
        q.fetch_add(len, Ordering::Relaxed);
        self.last_len = self.buf.len();
        let bytes = std::mem::take(&mut self.buf);
        let lines = std::mem::take(&mut self.lines);
        let _ = self.tx.send(Msg::Data {
            id: self.id,
            bytes,
            lines,
            seq: self.seq,
        });
    }
}

impl Tap for Recorder {
    fn start(
        &self,
        session: &str,
        job: Option<&str>,
        rank: Option<u64>,
        started: f64,
        header: &[u8],
    ) -> Box<dyn SessionTap> {
        Box::new(Recorder::start(self, session, job, rank, started, header))
    }
}

impl SessionTap for Trace {
    fn write(&mut self, line: &[u8], seq: u64) {
        Trace::write(self, line, seq);
    }

    fn recording(&self) -> bool {
        Trace::recording(self)
    }

    fn durable(&self) -> u64 {
        Trace::durable(self)
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if !self.queue_full {
            self.send();
        }
        self.stats
            .dropped_lines
            .fetch_add(self.dropped, Ordering::Relaxed);
        let reason = self.queue_full.then_some(Reason::QueueFull);
        let _ = self.tx.send(Msg::Close {
            id: self.id,
            reason,
        });
    }
}

#[cfg(test)]
mod tests;
