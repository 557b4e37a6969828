//! Unit tests' driver for a connection: each line through the path the server and the replay
//! take, as a batch of its own (`Conn::take`, then `Core::apply(Input::Lines)`, then
//! `Conn::applied`), and the close as the server applies it. Nothing here decides anything: a
//! rule a test checks is the connection's or the core's.

use super::conn::{Conn, Outcome};
use super::protocol;
use crate::core::apply::Core;
use crate::core::input::{Closing, Input, Lines};
use crate::core::model::Timestamp;

/// One line, arriving at `now`: parsed and numbered as the server's batch parses it (a line
/// that does not parse gets its error reply), applied by the core, and its outcome. The batch
/// asks for no request, so a test reads the requests due when it chooses (`requests`).
pub fn line(conn: &mut Conn, raw: &[u8], core: &mut Core, now: Timestamp) -> Outcome {
    let (msg, seq) = match protocol::parse_numbered(raw) {
        Ok(m) => m,
        Err(r) => return conn.reject(r),
    };
    let mut lines = Box::new(Lines::new(conn.link()));
    let pending = match conn.take(msg, seq, &mut lines.messages) {
        Ok(p) => p,
        Err(dropped) => return dropped,
    };
    lines.now = now;
    let mut lines = core
        .apply(Input::Lines(lines))
        .into_lines()
        .expect("the core answers lines with lines");
    conn.moved_on(lines.link);
    let applied = lines.applied.pop().expect("the core answers every message");
    conn.applied(applied, pending, raw, now)
}

/// The first request due to the connection's trainer at `now`, as its line: what the server
/// asks after each batch, asked with no line.
pub fn request(conn: &Conn, core: &mut Core, now: Timestamp) -> Option<Vec<u8>> {
    let mut ask = Box::new(Lines::new(conn.link()));
    ask.now = now;
    ask.ask = true;
    let mut done = core.apply(Input::Lines(ask)).into_lines()?;
    let mut out = Vec::new();
    Conn::requests(done.requests.drain(..), &mut out);
    out.into_iter().next()
}

/// The connection ends `how` at `now`, applied as the server applies it.
pub fn close(conn: Conn, core: &mut Core, how: Closing, now: Timestamp) {
    let closed = core
        .apply(Input::Close(conn.closing(how, now)))
        .into_closed()
        .expect("the core answers a close with its note");
    conn.closed(closed);
}
