//! One connection's protocol state: line numbers, resends dropped (acknowledgements), the rate
//! limit's notices, the replies' text and the session's trace. The session itself is the core's:
//! a line goes there as a typed message (`take`), and what the core made of it comes back as
//! the line's outcome (`applied`). Pure logic, so every rule is unit-tested without sockets.

use std::sync::Arc;

use super::protocol::{self, Code, Message, Rejection, Reply, CAP_ACK};
use super::resume::{Mark, Resume};
use crate::core::input::{Applied, Close, Closed, Closing, Link, Request};
use crate::core::model::Timestamp;
use crate::core::store::sessions::ArmLine;
use crate::core::tap::{SessionTap, Tap};
use crate::core::trainer::Peer;

const SERVER: &str = concat!("gpumon/", env!("CARGO_PKG_VERSION"));
/// Seconds between two `rate_limited` replies on one connection: one per line would flood a
/// client that is already sending too much, and may not be reading.
const LIMITED_REPLY_EVERY: f64 = 1.0;
/// An `ack` goes out when this long has passed since the last one, or this many numbered lines
/// went unacknowledged: a client at 100 lines/s gets about ten a second, not one per line.
const ACK_EVERY: f64 = 0.1;
const ACK_LINES: u64 = 64;

pub struct Conn {
    /// The connection as the core knows it (peer, session, recording).
    link: Link,
    line: u64,
    /// A hello was taken and no bye since: the core's hello-first rule, mirrored because a
    /// resend is checked against the mark only within a session, before the core sees it.
    open: bool,
    said_bye: bool,
    tap: Option<Arc<dyn Tap>>,
    trace: Option<Box<dyn SessionTap>>,
    /// Lines per second this connection may send (announced in its welcome).
    rate_limit: Option<u32>,
    /// When the last `rate_limited` reply went out, and lines dropped since.
    limited_reply: Option<Timestamp>,
    limited_dropped: u64,
    /// Acknowledgements (capability `ack`): the marks table, this client's mark once its hello
    /// asked for acks, the highest `seq` taken on this connection, and the last acknowledged.
    resume: Option<Arc<Resume>>,
    mark: Option<Arc<Mark>>,
    taken: u64,
    acked: u64,
    ack_sent: Option<Timestamp>,
}

/// What the caller should do after a line.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    /// Send this line back (welcome or error); `rejected` carries the code to count.
    Reply {
        line: Vec<u8>,
        rejected: Option<Code>,
    },
    /// Bye received: the session ended cleanly; the connection may close.
    Bye,
    /// A numbered line this client's instance already sent (a resend after a reconnect):
    /// dropped, counted, no reply.
    Duplicate,
}

/// A line handed to the core: its number and `seq` (0: none), for its outcome.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub line: u64,
    pub seq: u64,
}

impl Conn {
    pub fn new(peer: Peer) -> Self {
        Self {
            link: Link::new(peer),
            line: 0,
            open: false,
            said_bye: false,
            tap: None,
            trace: None,
            rate_limit: None,
            limited_reply: None,
            limited_dropped: 0,
            resume: None,
            mark: None,
            taken: 0,
            acked: 0,
            ack_sent: None,
        }
    }

    /// Acknowledges numbered lines to clients that ask (hello `caps` has `ack`), dropping lines
    /// an instance sends twice, against the marks in `resume`.
    pub fn acking(mut self, resume: Arc<Resume>) -> Self {
        self.resume = Some(resume);
        self
    }

    /// The connection's line rate limit, announced in the welcome and named in `rate_limited`.
    pub fn rate_limited(mut self, lines_per_second: u32) -> Self {
        self.rate_limit = Some(lines_per_second);
        self
    }

    /// Records this connection's session through `tap` (`--record-dir`).
    pub fn recording(mut self, tap: Option<Arc<dyn Tap>>) -> Self {
        self.link.recorded = tap.is_some();
        self.tap = tap;
        self
    }

    /// Whether this connection's session is recorded (its lines' bytes are needed).
    pub fn records(&self) -> bool {
        self.tap.is_some()
    }

    /// The connection as the core knows it, for an input.
    pub fn link(&self) -> Link {
        self.link
    }

    pub fn line_number(&self) -> u64 {
        self.line
    }

    /// A hello was accepted on this connection (its session may have ended with bye since).
    pub fn greeted(&self) -> bool {
        self.link.session.is_some() || self.said_bye
    }

    /// A rejection found before parsing (over-long line, rate limit).
    pub fn reject(&mut self, r: Rejection) -> Outcome {
        self.line += 1;
        error(self.line, r)
    }

    /// A line dropped for the rate limit: it still counts as a line (later errors keep their
    /// line numbers), and gets a `rate_limited` reply at most once a second, telling how many
    /// were dropped since the last one. None: dropped without a reply.
    pub fn over_limit(&mut self, now: Timestamp) -> Option<Outcome> {
        self.line += 1;
        self.limited_dropped += 1;
        // abs(): a wall clock stepped back must not silence the replies for good.
        if self
            .limited_reply
            .is_some_and(|t| (now - t).abs() < LIMITED_REPLY_EVERY)
        {
            return None;
        }
        let dropped = std::mem::take(&mut self.limited_dropped);
        let msg = match self.rate_limit {
            Some(n) => format!(
                "more than {n} lines/s (ingest.max_lines_per_second): {dropped} line(s) dropped since the last notice; the connection stays open. Send fewer samples (the welcome's max_lines_per_second is the limit), or raise the limit"
            ),
            None => format!("over the line rate limit: {dropped} line(s) dropped"),
        };
        self.limited_reply = Some(now);
        Some(error(self.line, Rejection::new(Code::RateLimited, msg)))
    }

    /// The first half of a parsed line, on the connection's task: numbers it and drops a
    /// resend (`Err(Duplicate)`); otherwise adds its message to `to_core`, for the core to
    /// apply in order, and says what to finish it with.
    pub fn take(
        &mut self,
        msg: Message,
        seq: Option<u64>,
        to_core: &mut Vec<Message>,
    ) -> Result<Pending, Outcome> {
        self.line += 1;
        if let (Some(seq), Some(mark), true) = (seq, &self.mark, self.open) {
            self.taken = self.taken.max(seq);
            if !mark.advance(seq) {
                return Err(Outcome::Duplicate);
            }
        }
        match &msg {
            Message::Hello(h) if !self.open => {
                self.open = true;
                self.mark = match &self.resume {
                    Some(r) if h.can(CAP_ACK) => {
                        Some(r.mark(self.link.peer.uid, h.instance.as_deref()))
                    }
                    _ => None,
                };
            }
            Message::Bye { .. } if self.open => self.open = false,
            _ => {}
        }
        to_core.push(msg);
        Ok(Pending {
            line: self.line,
            seq: seq.unwrap_or(0),
        })
    }

    /// The connection's link as the core left it after a batch.
    pub fn moved_on(&mut self, link: Link) {
        self.link = link;
    }

    /// The second half: what the core made of the line (from `raw`) becomes its outcome, and
    /// an accepted line goes to the session's trace.
    pub fn applied(&mut self, a: Applied, p: Pending, raw: &[u8], now: Timestamp) -> Outcome {
        match a {
            Applied::Opened(o) => {
                if let Some(tap) = &self.tap {
                    // Each part of the trace begins with the hello, the GPU it names and the
                    // uid the socket gave (a client cannot say whose job its trace is).
                    let mut header = raw.to_vec();
                    if let Some(gpu) = &o.trace_gpu {
                        header.push(b'\n');
                        header.extend_from_slice(gpu);
                    }
                    header.push(b'\n');
                    header
                        .extend_from_slice(&crate::core::trace::peer_line(self.link.peer.uid, now));
                    self.trace = Some(tap.start(&o.id, o.job.as_deref(), o.rank, now, &header));
                }
                let welcome = Reply::Welcome {
                    v: protocol::VERSION,
                    server: SERVER,
                    session: &o.id,
                    max_lines_per_second: self.rate_limit,
                    ack: self.mark.is_some(),
                };
                Outcome::Reply {
                    line: welcome.to_line(),
                    rejected: None,
                }
            }
            Applied::Accepted { note } => {
                if let Some(note) = note {
                    self.record(&note, 0);
                }
                self.record(raw, p.seq);
                Outcome::Accepted
            }
            Applied::Refused(r) => error(p.line, r.into()),
            Applied::Ended => {
                self.record(raw, p.seq);
                self.trace = None;
                self.said_bye = true;
                Outcome::Bye
            }
        }
    }

    /// The requests due to the trainer, as lines, added to `out`.
    pub fn requests(requests: impl Iterator<Item = Request>, out: &mut Vec<Vec<u8>>) {
        out.extend(requests.map(|r| request_line(&r)));
    }

    /// An `ack` line when one is due: the highest `seq` taken on this connection, held back
    /// to what the trace file holds while the session is recorded, so that no acknowledged
    /// line is missing from the trace if the daemon dies. Lines refused or dropped for the rate
    /// limit are covered by the next ack (they had their own reply; resending would not help).
    pub fn ack_due(&mut self, now: Timestamp) -> Option<Vec<u8>> {
        self.mark.as_ref()?;
        let upto = match &self.trace {
            Some(t) if t.recording() => self.taken.min(t.durable()),
            _ => self.taken,
        };
        let waited = self.ack_sent.is_none_or(|t| (now - t).abs() >= ACK_EVERY);
        if upto <= self.acked || !(waited || upto - self.acked >= ACK_LINES) {
            return None;
        }
        self.acked = upto;
        self.ack_sent = Some(now);
        Some(Reply::Ack { seq: upto }.to_line())
    }

    fn record(&mut self, raw: &[u8], seq: u64) {
        if let Some(t) = self.trace.as_mut() {
            t.write(raw, seq);
        }
    }

    /// The core's input for this connection ending `how`.
    pub fn closing(&self, how: Closing, now: Timestamp) -> Close {
        Close {
            link: self.link,
            how,
            now,
        }
    }

    /// The close applied: the trace ends with its note (a daemon stop, an idle close), so
    /// `gpumon analyze` reads the end as the daemon did.
    pub fn closed(mut self, c: Closed) {
        if let Some(note) = c.note {
            self.record(&note, 0);
        }
    }
}

/// An `error` reply for line `line`.
fn error(line: u64, r: Rejection) -> Outcome {
    Outcome::Reply {
        line: Reply::Error {
            code: r.code,
            line,
            message: &r.message,
        }
        .to_line(),
        rejected: Some(r.code),
    }
}

fn request_line(r: &Request) -> Vec<u8> {
    match r {
        Request::Attribute(r) => Reply::Attribute {
            v: protocol::ATTRIBUTE_VERSION,
            id: r.id,
            finding: &r.finding,
            steps: r.steps,
            seconds: r.seconds,
            max_entries: r.max_entries,
            top: r.top,
        }
        .to_line(),
        Request::Arm(ArmLine::Arm(r)) => Reply::Arm {
            v: protocol::ARM_VERSION,
            id: r.id,
            finding: &r.finding,
            seconds: r.seconds,
            max_entries: r.max_entries,
            peak_after_steps: r.peak_after_steps,
        }
        .to_line(),
        Request::Arm(ArmLine::Disarm { id }) => Reply::Disarm {
            v: protocol::ARM_VERSION,
            id: *id,
        }
        .to_line(),
    }
}

#[cfg(test)]
mod arm_tests;

#[cfg(test)]
mod tests;
