//! The ingest socket: accepts trainer connections and feeds their lines through `Conn` to the
//! aggregator, as typed inputs (a batch of parsed lines per read, a close). Replies and requests are written with `try_write` only, so a client that never reads
//! can cost us dropped lines but never a blocked task; over-long lines are skipped unbuffered; a client
//! past the line rate has its excess lines dropped and counted, with a `rate_limited` reply at most
//! once a second, and stays connected (its welcome names the limit so it can pace itself); one past
//! the connection cap gets one last error line naming the limit. A connection
//! must say hello within `hello_timeout` and then send something every `idle_timeout`; one
//! without hello gives its slot up to a newcomer when the table is full, and a quiet session of
//! a user over its fair share gives its slot to a user under it (`admission`), so no connections
//! and no set of users can lock another user's trainers out.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::batch::Batch;
use super::conn::{Conn, Outcome};
use super::line_budget::{LineBudget, STALE};
use super::lines::LineReader;
use super::protocol::{Code, Rejection, MAX_LINE};
use super::resume::Resume;
pub use super::stats::{Close, IngestStats};
use crate::core::aggregator::Handle;
use crate::core::input::{Closing, Input, Output};
use crate::core::model::now;
use crate::core::tap::Tap;
use crate::core::trainer::Peer;

mod admission;

use admission::{Admission, Caps, Eviction, Refusal, Slot};

/// Limits from the config.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// Sustained lines per second per connection; bursts of twice that are allowed.
    pub max_lines_per_second: u32,
    /// A connection that has not said hello this long after connecting is closed.
    pub hello_timeout: Duration,
    /// A connection that sent nothing this long after its hello is closed (its session ends
    /// cleanly, with an `idle_timeout` event: the trainer may well be alive).
    pub idle_timeout: Duration,
    /// Connections one uid may hold at once.
    pub max_per_uid: usize,
    /// Slots connections without hello may never take, so a hello always finds room.
    pub reserved: usize,
    /// Bytes all connections together may buffer past their first 4 KiB.
    pub line_buffer_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_lines_per_second: 1000,
            hello_timeout: Duration::from_secs(10),
            // A trainer stepping once a minute sends a line a minute: far inside this.
            idle_timeout: Duration::from_secs(900),
            max_per_uid: 256,
            reserved: 32,
            line_buffer_bytes: 16 << 20,
        }
    }
}

pub async fn serve(
    listener: UnixListener,
    aggregator: Handle,
    stats: Arc<IngestStats>,
    limits: Limits,
    tap: Option<Arc<dyn Tap>>,
    shutdown: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let admission = Admission::new(
        Caps {
            max_connections: limits.max_connections,
            max_per_uid: limits.max_per_uid,
            reserved: limits.reserved,
        },
        stats.clone(),
    );
    let resume = Arc::new(Resume::default());
    let budget = LineBudget::reporting(limits.line_buffer_bytes, stats.clone());
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "ingest accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Read before admitting: the per-uid cap needs it.
        let peer = match stream.peer_cred() {
            Ok(c) => Peer {
                pid: c.pid().unwrap_or(0).max(0) as u32,
                uid: c.uid(),
                gid: c.gid(),
            },
            Err(e) => {
                tracing::warn!(error = %e, "SO_PEERCRED failed; refusing the connection");
                continue;
            }
        };
        // The slot is taken here, before the task starts, so a burst of accepts cannot
        // overshoot the cap; the task owns it from then on and gives it back however it ends.
        let slot = match admission.admit(peer.uid) {
            Ok(slot) => slot,
            Err(refused) => {
                refuse(&stream, peer, refused, limits, &stats);
                continue;
            }
        };
        let (aggregator, stats, shutdown) = (aggregator.clone(), stats.clone(), shutdown.clone());
        let (tap, resume, budget) = (tap.clone(), resume.clone(), budget.clone());
        tracker.spawn(async move {
            let conn = Conn::new(peer)
                .recording(tap)
                .acking(resume)
                .rate_limited(limits.max_lines_per_second);
            let ctx = Ctx {
                aggregator: &aggregator,
                stats: &stats,
                limits,
                budget,
            };
            handle(stream, conn, slot, ctx, shutdown).await;
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// One last error line to a connection refused at connect (it is then dropped, closing it).
fn refuse(stream: &UnixStream, peer: Peer, refused: Refusal, limits: Limits, stats: &IngestStats) {
    stats.reject(Code::TooManyConnections);
    let msg = match refused {
        Refusal::Full(share) => {
            let why = if share.held >= share.share {
                format!("uid {} holds {} already", peer.uid, share.held)
            } else {
                "no user holds more than that".to_string()
            };
            format!(
                "connection limit of {} reached (ingest.max_connections), every slot has said hello, and a user's fair share is {} ({} / {} users holding slots): {why}; retry later",
                limits.max_connections, share.share, limits.max_connections, share.users
            )
        }
        Refusal::PerUid => {
            stats.closed(Close::PerUidLimit);
            format!(
                "uid {} holds {} connections, the limit per user (ingest.max_connections_per_uid); retry later",
                peer.uid, limits.max_per_uid
            )
        }
    };
    let line = reply_line(Conn::new(peer).reject(Rejection::new(Code::TooManyConnections, msg)));
    let _ = stream.try_write(&line);
}

/// How a connection's loop ended, for how its session is closed.
enum End {
    /// The peer closed.
    Peer,
    /// The daemon is shutting down.
    Shutdown,
    /// Closed by the daemon for `Close` (the session, if any, did not crash).
    Closed(Close),
}

/// What every connection's task shares.
struct Ctx<'a> {
    aggregator: &'a Handle,
    stats: &'a Arc<IngestStats>,
    limits: Limits,
    budget: Arc<LineBudget>,
}

async fn handle(
    stream: UnixStream,
    mut conn: Conn,
    mut slot: Slot,
    ctx: Ctx<'_>,
    shutdown: CancellationToken,
) {
    let Ctx {
        aggregator,
        stats,
        limits,
        budget,
    } = ctx;
    let (read, write) = stream.into_split();
    // The fd lives as long as `read`, which the reader owns.
    let fd = std::os::fd::AsRawFd::as_raw_fd(read.as_ref());
    let mut reader = LineReader::new(read, MAX_LINE)
        .with_budget(budget)
        .with_peek(Box::new(move |n| super::socket::line_end_queued(fd, n)));
    let mut bucket = TokenBucket::new(limits.max_lines_per_second);
    let mut batch = Batch::default().keeping_raw(conn.records());
    let send = |line: &[u8]| {
        // Never wait on the client: a full socket buffer means the reply is dropped.
        if !matches!(write.try_write(line), Ok(n) if n == line.len()) {
            stats.replies_dropped.fetch_add(1, Ordering::Relaxed);
        }
    };
    // Made once: a fresh one per read would register with the token (a lock) every time.
    let cancelled = shutdown.cancelled();
    tokio::pin!(cancelled);
    let evicted = slot.eviction().cancelled_owned();
    tokio::pin!(evicted);
    // One timer for both deadlines, re-armed lazily: a read only notes its time, and the timer
    // is moved on when it fires early, so a busy connection costs no timer update per read.
    let mut last_read = Instant::now();
    let timer = tokio::time::sleep_until(after(last_read, limits.hello_timeout));
    tokio::pin!(timer);
    let end = loop {
        tokio::select! {
            _ = &mut cancelled => break End::Shutdown,
            _ = &mut evicted => {
                let why = slot.evicted_now().unwrap_or(Eviction::Pending);
                break evict(&mut conn, slot.uid(), why, limits, stats, send);
            }
            _ = &mut timer => {
                if !slot.greeted() {
                    send(&hello_timeout_line(&mut conn, limits));
                    break End::Closed(Close::HelloTimeout);
                }
                let due = after(last_read, limits.idle_timeout);
                if Instant::now() >= due {
                    break End::Closed(Close::IdleTimeout);
                }
                timer.as_mut().reset(due);
                continue;
            }
            r = reader.fill() => {
                if r.is_err() {
                    if reader.reclaimed() {
                        send(&line_stalled_line(&mut conn, limits));
                        break End::Closed(Close::LineStalled);
                    }
                    break End::Peer;
                }
                last_read = Instant::now();
            }
        }
        batch.take(&mut reader, || bucket.take());
        // The session slot is taken before the hello opens a session, in one decision with
        // every other admission, so an evicted connection never opens one and the cap holds.
        let hello = !slot.greeted() && batch.has_hello();
        if hello {
            if let Err(why) = slot.claim().await {
                break evict(&mut conn, slot.uid(), why, limits, stats, send);
            }
        } else if slot.greeted() {
            slot.touch();
        }
        let lines = match batch.prepare(&mut conn, stats) {
            Some(lines) => {
                let applied = aggregator.apply(Input::Lines(lines)).await;
                // The aggregator is gone (the daemon is stopping) or failed on this input:
                // nothing is left to apply this connection's lines or its close to.
                let Some(lines) = applied.and_then(Output::into_lines) else {
                    return;
                };
                Some(lines)
            }
            None => None,
        };
        batch.complete(&mut conn, lines);
        if hello {
            if conn.greeted() {
                timer.as_mut().reset(after(last_read, limits.idle_timeout));
            } else {
                // The hello was refused: the connection is back to waiting for one.
                slot.unclaim();
            }
        }
        batch.finish(stats, send);
        if batch.closing {
            break End::Peer;
        }
        if reader.backlogged() {
            // One batch per turn, so a connection with a full socket buffer cannot starve the
            // other trainers or the HTTP side on the same worker.
            tokio::task::yield_now().await;
        }
    };
    if let End::Closed(why) = end {
        stats.closed(why);
    }
    let idle = match slot.evicted_now() {
        // Closed like an idle session: the trainer may well be alive, and reconnects.
        Some(why @ Eviction::Fair { .. }) => evicted_message(slot.uid(), why, limits),
        _ if matches!(end, End::Closed(Close::LineStalled)) => line_stalled_message(limits),
        _ => format!(
            "nothing sent for {} (ingest.idle_timeout_seconds); the daemon closed the connection",
            seconds(limits.idle_timeout)
        ),
    };
    let quiet = matches!(end, End::Closed(Close::IdleTimeout | Close::LineStalled))
        || matches!(slot.evicted_now(), Some(Eviction::Fair { .. }));
    let how = match end {
        // The daemon is going away, not the trainer: no crash to report.
        End::Shutdown => Closing::DaemonStopped,
        _ if quiet => Closing::Idle(idle),
        _ => Closing::Crash,
    };
    let close = Input::Close(conn.closing(how, now()));
    if let Some(closed) = aggregator.apply(close).await.and_then(Output::into_closed) {
        conn.closed(closed);
    }
    // `slot` drops here (or wherever this task unwinds): the connection's slot is free again.
}

/// `d` after `t`; a timeout too long for the clock (the config bounds it) waits a year.
fn after(t: Instant, d: Duration) -> Instant {
    t + d.min(Duration::from_secs(365 * 24 * 3600))
}

/// The last line to a connection that did not say hello in time.
fn hello_timeout_line(conn: &mut Conn, limits: Limits) -> Vec<u8> {
    let msg = format!(
        "no hello within {} of connecting (ingest.hello_timeout_seconds); closing",
        seconds(limits.hello_timeout)
    );
    reply_line(conn.reject(Rejection::new(Code::NoHello, msg)))
}

fn line_stalled_message(limits: Limits) -> String {
    format!(
        "a line longer than 4 KiB stayed unfinished for over {} s while other connections needed the {} bytes all connections may buffer for long lines (ingest.max_line_buffer_bytes); the daemon closed the connection. Write each line whole, in one write",
        STALE.as_secs(),
        limits.line_buffer_bytes
    )
}

fn line_stalled_line(conn: &mut Conn, limits: Limits) -> Vec<u8> {
    reply_line(conn.reject(Rejection::new(
        Code::LineTooLong,
        line_stalled_message(limits),
    )))
}

/// Sends the last line to an evicted connection and says how its loop ends.
fn evict(
    conn: &mut Conn,
    uid: u32,
    why: Eviction,
    limits: Limits,
    stats: &IngestStats,
    send: impl Fn(&[u8]),
) -> End {
    match why {
        Eviction::Fair { .. } => stats.reject(Code::Evicted),
        Eviction::Full(_) => stats.reject(Code::TooManyConnections),
        _ => {}
    }
    send(&evicted_line(conn, uid, why, limits));
    End::Closed(Close::Evicted)
}

/// Why a session gave its slot to another user, naming the share and what to do.
fn evicted_message(uid: u32, why: Eviction, limits: Limits) -> String {
    let Eviction::Fair {
        share,
        active,
        silent_ms,
    } = why
    else {
        return String::new();
    };
    let quiet = if active {
        format!("nothing sent for {:.1} s", silent_ms as f64 / 1000.0)
    } else {
        "no line since its hello".to_string()
    };
    format!(
        "evicted to make room for another user: uid {uid} held {} of the {} slots (ingest.max_connections), more than its fair share of {} ({} / {} users holding slots), and this was its quietest session ({quiet}); reconnect: a client with the ack capability resends what was not acknowledged",
        share.held, limits.max_connections, share.share, limits.max_connections, share.users
    )
}

/// The last line to an evicted connection.
fn evicted_line(conn: &mut Conn, uid: u32, why: Eviction, limits: Limits) -> Vec<u8> {
    let msg = match why {
        Eviction::Fair { .. } => {
            let msg = evicted_message(uid, why, limits);
            return reply_line(conn.reject(Rejection::new(Code::Evicted, msg)));
        }
        Eviction::Full(share) => {
            let msg = format!(
                "connection limit of {} reached (ingest.max_connections), every slot has said hello, and a user's fair share is {} ({} / {} users holding slots): uid {uid} holds {} already, or no user holds more than that; retry later",
                limits.max_connections, share.share, limits.max_connections, share.users, share.held
            );
            return reply_line(conn.reject(Rejection::new(Code::TooManyConnections, msg)));
        }
        Eviction::PerUid => format!(
            "no hello yet, and this uid holds {} connections (ingest.max_connections_per_uid): closing its oldest without hello to make room; send hello as soon as you connect",
            limits.max_per_uid
        ),
        Eviction::Pending => format!(
            "no hello yet, and the slots for connections without hello are taken (ingest.max_connections - ingest.reserved_connections = {}): closing the oldest to make room; send hello as soon as you connect",
            limits.max_connections.saturating_sub(limits.reserved).max(1)
        ),
    };
    reply_line(conn.reject(Rejection::new(Code::NoHello, msg)))
}

fn reply_line(o: Outcome) -> Vec<u8> {
    match o {
        Outcome::Reply { line, .. } => line,
        _ => Vec::new(),
    }
}

/// A duration as the config writes it: "10 s", "0.5 s".
fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
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
