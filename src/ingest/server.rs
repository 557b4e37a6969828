//! The ingest socket: accepts trainer connections and feeds their lines through `Conn` into the
//! store. Replies and requests are written with `try_write` only, so a client that never reads
//! can cost us dropped lines but never a blocked task; over-long lines are skipped unbuffered; a client
//! past the line rate or the connection cap gets one last error line naming the limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::batch::Batch;
use super::conn::{Conn, Outcome};
use super::lines::LineReader;
use super::protocol::{Code, Rejection, MAX_LINE};
use super::record::Recorder;
use crate::model::now;
use crate::store::sessions::Peer;
use crate::store::SharedStore;

/// Limits from the config.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// Sustained lines per second per connection; bursts of twice that are allowed.
    pub max_lines_per_second: u32,
}

/// Counters for the gpumon_ingest_* series.
#[derive(Debug, Default)]
pub struct IngestStats {
    pub connections: AtomicU64,
    pub lines: AtomicU64,
    pub rejected: [AtomicU64; Code::ALL.len()],
    /// Replies and requests not sent because the client was not reading.
    pub replies_dropped: AtomicU64,
    /// Requests (`attribute`) sent to trainers, dropped ones included.
    pub requests: AtomicU64,
}

impl IngestStats {
    pub(super) fn reject(&self, code: Code) {
        if let Some(i) = Code::ALL.iter().position(|c| *c == code) {
            self.rejected[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub async fn serve(
    listener: UnixListener,
    store: SharedStore,
    stats: Arc<IngestStats>,
    limits: Limits,
    recorder: Option<Arc<Recorder>>,
    shutdown: CancellationToken,
) {
    let tracker = TaskTracker::new();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "ingest accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if stats.connections.load(Ordering::Relaxed) as usize >= limits.max_connections {
            stats.reject(Code::TooManyConnections);
            let msg = format!(
                "connection limit of {} reached (ingest.max_connections); retry later",
                limits.max_connections
            );
            let mut conn = Conn::new(Peer {
                pid: 0,
                uid: 0,
                gid: 0,
            });
            if let Outcome::Reply { line, .. } =
                conn.reject(Rejection::new(Code::TooManyConnections, msg))
            {
                let _ = stream.try_write(&line);
            }
            continue;
        }
        // Counted before the task starts, so a burst of accepts cannot overshoot the cap.
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let (store, stats, shutdown) = (store.clone(), stats.clone(), shutdown.clone());
        let recorder = recorder.clone();
        tracker.spawn(async move {
            handle(stream, &store, &stats, limits, recorder, shutdown).await;
            stats.connections.fetch_sub(1, Ordering::Relaxed);
        });
    }
    tracker.close();
    tracker.wait().await;
}

async fn handle(
    stream: UnixStream,
    store: &SharedStore,
    stats: &IngestStats,
    limits: Limits,
    recorder: Option<Arc<Recorder>>,
    shutdown: CancellationToken,
) {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer {
            pid: c.pid().unwrap_or(0).max(0) as u32,
            uid: c.uid(),
            gid: c.gid(),
        },
        Err(e) => {
            tracing::warn!(error = %e, "SO_PEERCRED failed; refusing the connection");
            return;
        }
    };
    let (read, write) = stream.into_split();
    let mut reader = LineReader::new(read, MAX_LINE);
    let mut conn = Conn::new(peer).recording(recorder);
    let mut bucket = TokenBucket::new(limits.max_lines_per_second);
    let mut batch = Batch::default();
    let send = |line: &[u8]| {
        // Never wait on the client: a full socket buffer means the reply is dropped.
        if !matches!(write.try_write(line), Ok(n) if n == line.len()) {
            stats.replies_dropped.fetch_add(1, Ordering::Relaxed);
        }
    };
    let limited = || {
        let msg = format!(
            "more than {} lines/s (ingest.max_lines_per_second); closing. Send one sample per step, or raise the limit",
            limits.max_lines_per_second
        );
        Rejection::new(Code::RateLimited, msg)
    };
    // Made once: a fresh one per read would register with the token (a lock) every time.
    let cancelled = shutdown.cancelled();
    tokio::pin!(cancelled);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = &mut cancelled => {
                stopping = true;
                break;
            }
            r = reader.fill() => if r.is_err() { break },
        }
        batch.take(&mut reader, || bucket.take(), limited);
        if !batch.apply(&mut conn, &reader, store, stats) {
            break;
        }
        batch.finish(stats, send);
        if batch.closing {
            break;
        }
        if reader.backlogged() {
            // One batch per turn, so a connection with a full socket buffer cannot starve the
            // other trainers or the HTTP side on the same worker.
            tokio::task::yield_now().await;
        }
    }
    if let Ok(mut s) = store.write() {
        if stopping {
            // The daemon is going away, not the trainer: no crash to report.
            conn.close_for_shutdown(&mut s.sessions, now());
        } else {
            conn.close(&mut s.sessions, now());
        }
    }
}

/// Lines per second with a burst of two seconds' worth.
struct TokenBucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        Self {
            rate,
            tokens: 2.0 * rate,
            last: Instant::now(),
        }
    }

    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(2.0 * self.rate);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
