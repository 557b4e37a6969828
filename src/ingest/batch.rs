//! What one read brought in from a connection, handled together: framed and rate-checked line by
//! line in order, parsed outside the store lock, then applied under a single write lock, so 64
//! busy trainers cost one lock round-trip per read instead of one per line. Every line still
//! gets exactly what handling it alone would give: its own line number, its error reply, its
//! count; a rate-limited line ends the batch and the connection, as before.

use std::ops::Range;
use std::sync::atomic::Ordering;

use tokio::io::AsyncRead;

use super::conn::{Conn, Outcome};
use super::lines::{Frame, LineReader};
use super::protocol::{self, Code, Message, Rejection, MAX_LINE};
use super::server::IngestStats;
use crate::model::now;
use crate::store::SharedStore;

/// Lines taken per batch at most, so one connection's burst holds the lock and its worker
/// thread only briefly (256 sample lines parse in well under a millisecond).
const MAX_LINES: usize = 256;

// Nearly every item is a Msg and the Vec is reused across batches: boxing the big variant would
// only add an allocation per line.
#[allow(clippy::large_enum_variant)]
enum Item {
    /// A parsed line, and where its raw bytes lie in the reader's buffer.
    Msg(Message, Range<usize>),
    Reject(Rejection),
    /// The peer closed in the middle of a line: counted as bad_json, no reply (it is gone).
    Partial,
}

#[derive(Default)]
pub struct Batch {
    items: Vec<Item>,
    outcomes: Vec<Outcome>,
    /// A request for the trainer that came due with this batch, sent after its replies.
    request: Option<Vec<u8>>,
    /// The connection ends after this batch (EOF, or a line over the rate limit).
    pub closing: bool,
}

impl Batch {
    /// Takes the frames `reader` has buffered, in order. `admit` is asked once per frame (the
    /// rate limit); the first frame it refuses gets `limited`'s rejection and ends the batch.
    pub fn take<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut LineReader<R>,
        mut admit: impl FnMut() -> bool,
        limited: impl Fn() -> Rejection,
    ) {
        while self.items.len() < MAX_LINES {
            let Some(frame) = reader.next_buffered() else {
                return;
            };
            let item = match frame {
                Frame::Eof { partial } => {
                    self.closing = true;
                    if partial > 0 {
                        self.items.push(Item::Partial);
                    }
                    return;
                }
                _ if !admit() => {
                    self.closing = true;
                    self.items.push(Item::Reject(limited()));
                    return;
                }
                Frame::TooLong { len } => Item::Reject(Rejection::new(
                    Code::LineTooLong,
                    format!("line of {len} bytes exceeds {MAX_LINE}; it was skipped"),
                )),
                Frame::Line(line) => match protocol::parse(line) {
                    Ok(msg) => Item::Msg(msg, reader.last_line()),
                    Err(r) => Item::Reject(r),
                },
            };
            self.items.push(item);
        }
    }

    /// Applies the batch to the connection and the store, taking the write lock once (and only
    /// when a line needs it). `reader` still holds the batch's raw lines (it has not read since
    /// `take`). False when the store is unusable (a poisoned lock).
    pub fn apply<R: AsyncRead + Unpin>(
        &mut self,
        conn: &mut Conn,
        reader: &LineReader<R>,
        store: &SharedStore,
        stats: &IngestStats,
    ) -> bool {
        let ts = now();
        let mut guard = None;
        for item in self.items.drain(..) {
            let outcome = match item {
                Item::Msg(msg, raw) => {
                    if guard.is_none() {
                        let Ok(g) = store.write() else { return false };
                        guard = Some(g);
                    }
                    let Some(s) = guard.as_mut() else {
                        return false;
                    };
                    conn.apply(msg, reader.bytes(raw), &mut s.sessions, ts)
                }
                Item::Reject(r) => conn.reject(r),
                Item::Partial => {
                    stats.reject(Code::BadJson);
                    continue;
                }
            };
            self.outcomes.push(outcome);
        }
        // Asked once per batch, under the lock already held: a request comes due only when a
        // sample changed the session.
        if let Some(s) = guard.as_mut() {
            self.request = conn.request(&mut s.sessions, ts);
        }
        true
    }

    /// Counts the outcomes and sends the replies, in line order, then a request that came due;
    /// after the lock is released.
    pub fn finish(&mut self, stats: &IngestStats, send: impl Fn(&[u8])) {
        let mut accepted = 0;
        for outcome in self.outcomes.drain(..) {
            match outcome {
                Outcome::Accepted | Outcome::Bye => accepted += 1,
                Outcome::Reply { line, rejected } => {
                    match rejected {
                        Some(code) => stats.reject(code),
                        None => accepted += 1,
                    }
                    send(&line);
                }
            }
        }
        if accepted > 0 {
            stats.lines.fetch_add(accepted, Ordering::Relaxed);
        }
        if let Some(r) = self.request.take() {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            send(&r);
        }
    }
}

#[cfg(test)]
mod tests;
