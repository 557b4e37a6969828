//! What one read brought in from a connection, handled together: framed, rate-checked, parsed
//! and numbered line by line in order on the connection's task, then the parsed messages applied
//! by the core as one input (`Lines`), so 64 busy trainers cost one aggregator hand-off per read
//! instead of one per line; then each line's outcome, in order, on the task again. Every line still
//! gets exactly what handling it alone would give: its own line number, its error reply, its
//! count. A line over the rate limit is dropped and counted, and the connection goes on; the
//! lines that end or open a session (hello, bye) and an `oom` event are never dropped.

use std::ops::Range;
use std::sync::atomic::Ordering;

use tokio::io::AsyncRead;

use super::conn::{Conn, Outcome, Pending};
use super::lines::{Frame, LineReader};
use super::protocol::{self, Code, Message, Rejection, MAX_LINE};
use super::stats::IngestStats;
use crate::core::input::Lines;
use crate::core::model::{now, Timestamp};

/// Lines taken per batch at most, so one connection's burst holds the aggregator and its worker
/// thread only briefly (256 sample lines parse in well under a millisecond).
const MAX_LINES: usize = 256;
/// Longest line over the rate limit still parsed to see whether it is exempt: hello, bye and
/// oom lines are far shorter, and a flood of long lines then costs no parsing.
const MAX_EXEMPT_LINE: usize = 4096;
/// Lines the vectors keep room for at least: a trainer keeping up sends one or two a read.
const SMALL: usize = 4;
/// Batches per look at the room the vectors hold against what those batches needed.
const RUN: u32 = 16;
/// Room over this many times the largest batch of a run is given back: what a burst grew (the
/// hour of history a trainer resends at connect fills them to 256 lines) is not kept by a
/// connection that sends a line a second, nor by one that sends 16 a read.
const SLACK: usize = 4;

// Nearly every item is a Msg and the Vec is reused across batches: boxing the big variant would
// only add an allocation per line.
#[allow(clippy::large_enum_variant)]
enum Item {
    /// A parsed line, where its raw bytes lie in the batch's `raw`, and its `seq`.
    Msg(Message, Range<usize>, Option<u64>),
    Reject(Rejection),
    /// Over the rate limit: dropped.
    Limited,
    /// The peer closed in the middle of a line: counted as bad_json, no reply (it is gone).
    Partial,
}

/// A line's place in the batch's outcomes: known already, or the core's answer to come.
enum Slot {
    Done(Outcome),
    /// Its message went to the core; where its raw bytes lie.
    Core(Pending, Range<usize>),
}

#[derive(Default)]
pub struct Batch {
    items: Vec<Item>,
    /// The parsed lines' bytes (a recorded session writes them as received), copied out of the
    /// reader, which the next read reuses; only when `keep_raw`.
    raw: Vec<u8>,
    keep_raw: bool,
    slots: Vec<Slot>,
    outcomes: Vec<Outcome>,
    /// The messages for the core and its answers, kept between batches for their room (away
    /// at the aggregator in between).
    lines: Option<Box<Lines>>,
    /// When the batch was prepared: its lines' arrival.
    now: Timestamp,
    /// Requests for the trainer that came due with this batch, sent after its replies.
    requests: Vec<Vec<u8>>,
    /// An `ack` that came due with this batch, sent last.
    ack: Option<Vec<u8>>,
    /// Lines dropped for the rate limit without a reply (counted at `finish`).
    silenced: u64,
    /// Lines the client says it dropped because the daemon could not take them.
    client_dropped: u64,
    /// The connection ends after this batch (EOF).
    pub closing: bool,
    /// Batches in the current run, and the most lines and raw bytes one of them held.
    run: u32,
    run_lines: usize,
    run_bytes: usize,
}

/// Lines the rate limit never drops: a session's start and end (a bye dropped would turn a clean
/// end into a crash finding), and an out-of-memory report, the one line a dying trainer has.
fn exempt(msg: &Message) -> bool {
    match msg {
        Message::Hello(_) | Message::Bye { .. } => true,
        Message::Event(e) => e.kind == crate::core::trainer::EventKind::Oom,
        Message::Sample(_) | Message::Attribution(_) | Message::Armed(_) | Message::Peak(_) => {
            false
        }
    }
}

impl Batch {
    /// Keeps each parsed line's bytes for the aggregator (the connection's session is recorded);
    /// otherwise they are not copied at all.
    pub fn keeping_raw(mut self, keep: bool) -> Self {
        self.keep_raw = keep;
        self
    }

    /// Takes the frames `reader` has buffered, in order. `admit` is asked once per frame (the
    /// rate limit); a frame it refuses is dropped unless `exempt`.
    pub fn take<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut LineReader<R>,
        mut admit: impl FnMut() -> bool,
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
                Frame::TooLong { .. } if !admit() => Item::Limited,
                Frame::TooLong { len } => Item::Reject(Rejection::new(
                    Code::LineTooLong,
                    format!("line of {len} bytes exceeds {MAX_LINE}; it was skipped"),
                )),
                Frame::Line(line) => {
                    let admitted = admit();
                    if !admitted && line.len() > MAX_EXEMPT_LINE {
                        Item::Limited
                    } else {
                        match protocol::parse_numbered(line) {
                            Ok((msg, seq)) if admitted || exempt(&msg) => {
                                let start = self.raw.len();
                                if self.keep_raw {
                                    self.raw.extend_from_slice(line);
                                }
                                Item::Msg(msg, start..self.raw.len(), seq)
                            }
                            Ok(_) => Item::Limited,
                            Err(r) if admitted => Item::Reject(r),
                            Err(_) => Item::Limited,
                        }
                    }
                }
            };
            self.items.push(item);
        }
    }

    /// Numbers the batch's lines and drops resends, on the connection's task; the parsed
    /// messages left, for the core to apply as one input (None: nothing for it).
    pub fn prepare(&mut self, conn: &mut Conn, stats: &IngestStats) -> Option<Box<Lines>> {
        let ts = now();
        self.now = ts;
        self.note_size();
        let mut lines = self
            .lines
            .take()
            .unwrap_or_else(|| Box::new(Lines::new(conn.link())));
        for item in self.items.drain(..) {
            let slot = match item {
                Item::Msg(msg, raw, seq) => {
                    if let Message::Event(crate::core::trainer::Event {
                        dropped: Some(n), ..
                    }) = &msg
                    {
                        self.client_dropped = self.client_dropped.saturating_add(*n);
                    }
                    match conn.take(msg, seq, &mut lines.messages) {
                        Ok(pending) => Slot::Core(pending, raw),
                        Err(outcome) => Slot::Done(outcome),
                    }
                }
                Item::Reject(r) => Slot::Done(conn.reject(r)),
                Item::Limited => match conn.over_limit(ts) {
                    Some(reply) => Slot::Done(reply),
                    None => {
                        self.silenced += 1;
                        continue;
                    }
                },
                Item::Partial => {
                    stats.reject(Code::BadJson);
                    continue;
                }
            };
            self.slots.push(slot);
        }
        if lines.messages.is_empty() {
            self.lines = Some(lines);
            return None;
        }
        lines.link = conn.link();
        lines.now = ts;
        // Asked once per batch: a request comes due only when a line changed the session.
        lines.ask = true;
        Some(lines)
    }

    /// What the core made of the messages (`lines`, as it gave them back; None when none went):
    /// each line's outcome in order, the session's trace written, the requests due, an ack.
    pub fn complete(&mut self, conn: &mut Conn, lines: Option<Box<Lines>>) {
        let mut lines = lines;
        if let Some(l) = &lines {
            conn.moved_on(l.link);
        }
        let mut applied = lines.as_mut().map(|l| l.applied.drain(..));
        for slot in self.slots.drain(..) {
            let outcome = match slot {
                Slot::Done(o) => o,
                Slot::Core(pending, raw) => {
                    // Never None: the core answers every message it was given.
                    let Some(a) = applied.as_mut().and_then(Iterator::next) else {
                        continue;
                    };
                    let raw = self.raw.get(raw).unwrap_or_default();
                    conn.applied(a, pending, raw, self.now)
                }
            };
            self.outcomes.push(outcome);
        }
        drop(applied);
        if let Some(mut l) = lines {
            Conn::requests(l.requests.drain(..), &mut self.requests);
            self.lines = Some(l);
        }
        self.raw.clear();
        self.ack = conn.ack_due(self.now);
    }

    /// Notes the batch's size, and at the end of each run of `RUN` batches gives back the room
    /// that run did not need, so 64 trainers past their burst do not each hold what it grew.
    fn note_size(&mut self) {
        self.run_lines = self.run_lines.max(self.items.len());
        self.run_bytes = self.run_bytes.max(self.raw.len());
        self.run += 1;
        if self.run < RUN {
            return;
        }
        let lines = std::mem::take(&mut self.run_lines).max(SMALL);
        let bytes = std::mem::take(&mut self.run_bytes).max(SMALL * 1024);
        self.run = 0;
        if self.items.capacity() > SLACK * lines || self.raw.capacity() > SLACK * bytes {
            self.items.shrink_to(lines);
            self.slots.shrink_to(lines);
            self.outcomes.shrink_to(lines);
            self.raw.shrink_to(bytes);
            if let Some(l) = self.lines.as_mut() {
                l.messages.shrink_to(lines);
                l.applied.shrink_to(lines);
            }
            crate::malloc::burst_freed();
        }
    }

    /// Whether the batch holds a hello (admission gives it a session slot before it is applied).
    pub fn has_hello(&self) -> bool {
        self.items
            .iter()
            .any(|i| matches!(i, Item::Msg(Message::Hello(_), ..)))
    }

    /// Counts the outcomes and sends the replies, in line order, then a request that came due;
    /// back on the connection's task.
    pub fn finish(&mut self, stats: &IngestStats, send: impl Fn(&[u8])) {
        let mut accepted = 0;
        let mut duplicates = 0;
        for outcome in self.outcomes.drain(..) {
            match outcome {
                Outcome::Accepted | Outcome::Bye => accepted += 1,
                Outcome::Duplicate => duplicates += 1,
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
        if duplicates > 0 {
            stats.duplicates.fetch_add(duplicates, Ordering::Relaxed);
        }
        // One count per dropped line: those with a reply were counted above, by its code.
        let dropped = std::mem::take(&mut self.client_dropped);
        if dropped > 0 {
            stats.dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        let silenced = std::mem::take(&mut self.silenced);
        if silenced > 0 {
            stats.reject_many(Code::RateLimited, silenced);
        }
        for r in self.requests.drain(..) {
            stats.requests.fetch_add(1, Ordering::Relaxed);
            send(&r);
        }
        if let Some(a) = self.ack.take() {
            send(&a);
        }
    }
}

#[cfg(test)]
mod tests;
