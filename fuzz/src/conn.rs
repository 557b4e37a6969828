//! Target `conn`: the connection state machine (`Conn`) over a session store with small limits,
//! driven by the input split into lines, each taken as the daemon takes it off a socket: framed
//! by ingest's `LineReader` (a line over the cap skipped by its length), parsed, numbered by
//! `Conn::take`, applied by the core as a batch of parsed lines, answered by `Conn::applied`. A line starting with a NUL byte is a control line
//! instead: `\0c` closes the current connection (as a dropped socket does) and opens a fresh
//! one in its place, `\0` + any other byte switches to connection `byte % 3`.
//!
//! Each outcome is checked against a model built from `parse` and what the connection has seen,
//! and after every line: no panic; live sessions are exactly the connections that said hello;
//! points, events and ended sessions stay within the limits; a session's sample count equals
//! the sample lines accepted for it; closing a connection always ends its session.

use std::future::Future;
use std::task::{Context, Poll, Waker};

use gpumon::core::apply::Core;
use gpumon::core::input::{Closing, Input, Lines};
use gpumon::core::store::sessions::{SessionLimits, Sessions};
use gpumon::core::trainer::{Ending, Peer};
use gpumon::sources::ingest::conn::{Conn, Outcome};
use gpumon::sources::ingest::lines::{Frame, LineReader};
use gpumon::sources::ingest::protocol::{self, Code, Message, Rejection, MAX_LINE};

use crate::parse::{check_error_line, one_json_line};

const CONNS: usize = 3;
const LIMITS: SessionLimits = SessionLimits {
    points: 4,
    events: 3,
    ended_kept: 2,
};
const T0: f64 = 1_763_700_000.0;

struct Slot {
    conn: Conn,
    lines: u64,
    /// The session id from the welcome, while the session is open.
    session: Option<String>,
    /// Sample lines accepted for that session.
    samples: u64,
}

impl Slot {
    fn new(i: usize) -> Self {
        Self {
            conn: Conn::new(Peer {
                pid: 100 + i as u32,
                uid: 1000,
                gid: 1000,
            }),
            lines: 0,
            session: None,
            samples: 0,
        }
    }
}

pub fn check(data: &[u8]) {
    let mut core = Core::with_sessions(Sessions::new(LIMITS));
    let mut slots: Vec<Slot> = (0..CONNS).map(Slot::new).collect();
    let mut ids_seen = 0u64;
    let mut cur = 0;
    for (i, line) in data.split(|&c| c == b'\n').enumerate() {
        let now = T0 + i as f64;
        match line {
            [0, b'c', ..] => {
                let old = std::mem::replace(&mut slots[cur], Slot::new(cur));
                close(old, &mut core, now);
            }
            [0, b, ..] => cur = usize::from(*b) % CONNS,
            [0] => {}
            _ => feed(&mut slots[cur], line, &mut core, now, &mut ids_seen),
        }
        invariants(&slots, core.sessions());
    }
    for slot in slots {
        close(slot, &mut core, T0 + 1e6);
    }
    assert_eq!(core.sessions().live_count(), 0);
}

fn feed(slot: &mut Slot, line: &[u8], core: &mut Core, now: f64, ids_seen: &mut u64) {
    slot.lines += 1;
    let live_before = core.sessions().live_count();
    // What the server does with a line over the cap: the reader skipped it.
    let parsed = if line.len() > MAX_LINE {
        Err(Rejection::new(Code::LineTooLong, "skipped"))
    } else {
        protocol::parse(line)
    };
    let outcome = take_line(&mut slot.conn, line, core, now);
    assert_eq!(slot.conn.line_number(), slot.lines);
    match (parsed, slot.session.is_some(), outcome) {
        (
            Err(r),
            _,
            Outcome::Reply {
                line: reply,
                rejected,
            },
        ) => {
            assert_eq!(rejected, Some(r.code));
            check_error_line(&reply, r.code, slot.lines, None);
        }
        (Ok(Message::Hello(_)), false, Outcome::Reply { line, rejected }) => {
            assert_eq!(rejected, None);
            let v = one_json_line(&line);
            assert_eq!(v["type"], "welcome", "{v}");
            assert_eq!(v["v"], protocol::VERSION, "{v}");
            assert!(v["server"]
                .as_str()
                .is_some_and(|s| s.starts_with("gpumon/")));
            // Ids are never reused: each welcome names a session newer than all before it.
            *ids_seen += 1;
            let id = format!("s-{ids_seen}");
            assert_eq!(v["session"], id.as_str(), "{v}");
            assert_eq!(core.sessions().live_count(), live_before + 1);
            slot.session = Some(id);
            slot.samples = 0;
        }
        (Ok(Message::Hello(_)), true, Outcome::Reply { line, rejected }) => {
            assert_eq!(rejected, Some(Code::DuplicateHello));
            check_error_line(&line, Code::DuplicateHello, slot.lines, None);
        }
        (Ok(_), false, Outcome::Reply { line, rejected }) => {
            assert_eq!(rejected, Some(Code::NoHello));
            check_error_line(&line, Code::NoHello, slot.lines, None);
        }
        (Ok(Message::Sample(_)), true, Outcome::Accepted) => slot.samples += 1,
        (Ok(Message::Event(_)), true, Outcome::Accepted) => {}
        // An answer is taken only for the request it answers, and this connection's batches
        // ask for none: every answer answers no open request.
        (
            Ok(Message::Attribution(_) | Message::Armed(_) | Message::Peak(_)),
            true,
            Outcome::Reply { line, rejected },
        ) => {
            assert_eq!(rejected, Some(Code::BadField));
            check_error_line(&line, Code::BadField, slot.lines, None);
        }
        (Ok(Message::Bye { .. }), true, Outcome::Bye) => {
            let id = slot.session.take();
            let ended = core
                .sessions()
                .ended()
                .last()
                .map(|s| (s.id.clone(), s.ended));
            assert_eq!(
                ended,
                Some((id.unwrap_or_default(), Some((now, Ending::Clean))))
            );
        }
        (parsed, has_session, outcome) => {
            panic!("line {line:?} with session={has_session}: parsed {parsed:?}, got {outcome:?}")
        }
    }
}

/// `line` as one read of a socket brings it: framed, then through both halves of the
/// connection around the core's apply, as ingest's batch does.
fn take_line(conn: &mut Conn, line: &[u8], core: &mut Core, now: f64) -> Outcome {
    let mut input = line.to_vec();
    input.push(b'\n');
    let mut reader = LineReader::new(&input[..], MAX_LINE);
    let mut cx = Context::from_waker(Waker::noop());
    // An in-memory reader is always ready: one poll reads the frame.
    let mut next = std::pin::pin!(reader.next());
    let frame = match next.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(f)) => f,
        other => panic!("framing one line from memory: {other:?}"),
    };
    let (msg, seq) = match frame {
        Frame::Line(l) => match protocol::parse_numbered(l) {
            Ok(m) => m,
            Err(r) => return conn.reject(r),
        },
        Frame::TooLong { len } => {
            return conn.reject(Rejection::new(
                Code::LineTooLong,
                format!("line of {len} bytes exceeds {MAX_LINE}; it was skipped"),
            ))
        }
        Frame::Eof { .. } => panic!("a newline-terminated line framed as the end"),
    };
    let mut batch = Box::new(Lines::new(conn.link()));
    let pending = match conn.take(msg, seq, &mut batch.messages) {
        Ok(p) => p,
        Err(o) => return o,
    };
    batch.now = now;
    let Some(mut done) = core.apply(Input::Lines(batch)).into_lines() else {
        panic!("lines in, lines out");
    };
    conn.moved_on(done.link);
    match done.applied.pop() {
        Some(a) => conn.applied(a, pending, line, now),
        None => panic!("the core answers every message"),
    }
}

fn close(slot: Slot, core: &mut Core, now: f64) {
    let live_before = core.sessions().live_count();
    let closing = slot.conn.closing(Closing::Crash, now);
    if let Some(closed) = core.apply(Input::Close(closing)).into_closed() {
        slot.conn.closed(closed);
    }
    let sessions = core.sessions();
    let Some(id) = slot.session else {
        assert_eq!(
            sessions.live_count(),
            live_before,
            "close without a session"
        );
        return;
    };
    assert_eq!(sessions.live_count(), live_before - 1);
    assert!(sessions.live().all(|s| s.id != id), "{id} still live");
    let last = sessions.ended().last();
    assert_eq!(last.map(|s| s.id.as_str()), Some(id.as_str()));
    assert_eq!(last.and_then(|s| s.ended), Some((now, Ending::Crash)));
    let kind = last.and_then(|s| s.events.back()).map(|e| e.kind.as_str());
    assert_eq!(kind, Some("crash"));
}

fn invariants(slots: &[Slot], sessions: &Sessions) {
    let open: Vec<&Slot> = slots.iter().filter(|s| s.session.is_some()).collect();
    assert_eq!(sessions.live_count(), open.len());
    for s in sessions.live() {
        let slot = open
            .iter()
            .find(|o| o.session.as_deref() == Some(&s.id))
            .unwrap_or_else(|| panic!("live session {} has no connection", s.id));
        assert_eq!(s.samples, slot.samples, "{}", s.id);
        assert!(s.series.len() <= LIMITS.points && s.series.len() as u64 <= s.samples);
        assert!(s.events.len() <= LIMITS.events);
        assert!(s.ended.is_none());
    }
    assert!(sessions.ended().count() <= LIMITS.ended_kept);
    for s in sessions.ended() {
        assert!(s.ended.is_some() && s.events.len() <= LIMITS.events);
        assert!(s.series.len() <= LIMITS.points && s.series.len() as u64 <= s.samples);
    }
}
