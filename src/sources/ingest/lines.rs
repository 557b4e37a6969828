//! Newline framing with a hard cap, in place: lines are handed out as slices of the read buffer
//! (no copy, no allocation per line), and everything one read brought in can be taken as a batch.
//! A line longer than the cap is skipped up to its newline without ever being buffered whole, so
//! a client cannot make the daemon hold more than one cap's worth of bytes per connection.

use std::ops::Range;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::line_budget::{Grant, LineBudget, BASE};

/// What the reader found next.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A complete line, newline stripped (a trailing `\r` too).
    Line(&'a [u8]),
    /// A line over the cap was skipped; `len` is how long it was (newline excluded).
    TooLong { len: usize },
    /// The peer closed; `partial` is how many bytes of an unterminated last line were dropped.
    Eof { partial: usize },
}

/// Read size while lines come in bursts: a few dozen sample lines per read.
const CHUNK: usize = 16 * 1024;
/// Read size while a trainer keeps up (a line or two a read): what 64 quiet connections hold.
const QUIET: usize = 4 * 1024;
/// Reads that did not fill the buffer, in a row, before it goes back to `QUIET`.
const QUIET_RUN: u32 = 16;

pub struct LineReader<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
    /// Unconsumed bytes are `buf[start..end]`. Consumed bytes stay in place until the next
    /// read, so the lines of a batch can be looked at again (`bytes`) while it is applied.
    start: usize,
    end: usize,
    /// `buf[start..scanned]` is known to hold no newline, so no byte is searched twice.
    scanned: usize,
    /// Length so far of an over-long line being skipped.
    skipping: Option<usize>,
    eof: bool,
    eof_reported: bool,
    /// The last read filled the buffer: the socket likely holds more.
    full_read: bool,
    /// Reads in a row that did not fill the buffer, up to `QUIET_RUN`.
    quiet: u32,
    /// Where the last `Frame::Line` lies in `buf`.
    last_line: Range<usize>,
    /// Shared by all connections: a buffer past `BASE` grows only with a grant from it.
    budget: Option<Arc<LineBudget>>,
    grant: Option<Grant>,
    /// The budget took the grant back from this reader, sitting on an unfinished line.
    reclaimed: bool,
    /// Whether the socket already holds a newline within its next `n` bytes (not taken).
    peek: Option<PeekLineEnd>,
}

/// Looks into a socket without taking from it: is a newline within its next `n` bytes?
pub type PeekLineEnd = Box<dyn Fn(usize) -> bool + Send + Sync>;

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            max,
            buf: vec![0; QUIET.min(max + 1)],
            start: 0,
            end: 0,
            scanned: 0,
            skipping: None,
            eof: false,
            eof_reported: false,
            full_read: false,
            quiet: 0,
            last_line: 0..0,
            budget: None,
            grant: None,
            reclaimed: false,
            peek: None,
        }
    }

    /// Lets the budget see that a waiting line is whole in the socket (its client wrote it in
    /// one go), so it is not taken for a stalled one.
    pub fn with_peek(mut self, peek: PeekLineEnd) -> Self {
        self.peek = Some(peek);
        self
    }

    /// Lines longer than `BASE` are buffered within `budget`, shared with other connections.
    pub fn with_budget(mut self, budget: Arc<LineBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    fn reclaimed_error(&mut self) -> std::io::Error {
        self.reclaimed = true;
        std::io::Error::other(
            "an unfinished line's buffer was taken back (ingest.max_line_buffer_bytes)",
        )
    }

    /// The read failed because the line budget took this connection's share back.
    pub fn reclaimed(&self) -> bool {
        self.reclaimed
    }

    /// Waits until at least one frame is buffered. After the `Eof` frame was taken it returns
    /// at once and `next_buffered` yields nothing more.
    pub async fn fill(&mut self) -> std::io::Result<()> {
        while !self.ready() {
            self.read_more().await?;
        }
        Ok(())
    }

    /// The next frame already buffered, without reading; `None` when more bytes are needed.
    pub fn next_buffered(&mut self) -> Option<Frame<'_>> {
        let Some(i) = self.newline() else {
            if self.eof && !self.eof_reported {
                self.eof_reported = true;
                let partial = self.skipping.take().unwrap_or(0) + self.end - self.start;
                self.start = self.end;
                return Some(Frame::Eof { partial });
            }
            return None;
        };
        let from = self.start;
        self.start += i + 1;
        if let Some(skipped) = self.skipping.take() {
            return Some(Frame::TooLong { len: skipped + i });
        }
        if i > self.max {
            return Some(Frame::TooLong { len: i });
        }
        let mut to = from + i;
        if self.buf[from..to].last() == Some(&b'\r') {
            to -= 1;
        }
        self.last_line = from..to;
        if let Some(g) = &self.grant {
            g.progressed();
        }
        Some(Frame::Line(&self.buf[from..to]))
    }

    /// What it reads from (a replayed trace's file says whether it ended mid-line).
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Where the line last returned by `next_buffered` lies, for `bytes`.
    pub fn last_line(&self) -> Range<usize> {
        self.last_line.clone()
    }

    /// Bytes of a line taken since the last `fill` (a range from `last_line`); empty if the
    /// range is stale.
    pub fn bytes(&self, r: Range<usize>) -> &[u8] {
        self.buf.get(r).unwrap_or_default()
    }

    /// More input is probably waiting: frames are still buffered, or the last read filled the
    /// buffer. A reader that is merely keeping up says no, and needs no turn-taking.
    pub fn backlogged(&mut self) -> bool {
        self.full_read || self.newline().is_some()
    }

    /// Waits for the next frame (one at a time; the server takes batches with `fill`).
    pub async fn next(&mut self) -> std::io::Result<Frame<'_>> {
        self.fill().await?;
        Ok(self.next_buffered().unwrap_or(Frame::Eof { partial: 0 }))
    }

    fn ready(&mut self) -> bool {
        self.eof || self.newline().is_some()
    }

    /// Where the next newline is, relative to `start`.
    fn newline(&mut self) -> Option<usize> {
        let from = self.scanned.max(self.start);
        match memchr::memchr(b'\n', &self.buf[from..self.end]) {
            Some(i) => Some(from - self.start + i),
            None => {
                self.scanned = self.end;
                None
            }
        }
    }

    /// Reads once more. Called only when no newline is buffered, so the pending bytes are the
    /// start of one unfinished line.
    async fn read_more(&mut self) -> std::io::Result<()> {
        let pending = self.end - self.start;
        if self.skipping.is_some() || pending > self.max {
            // Over the cap: forget the bytes, remember only how many there were.
            *self.skipping.get_or_insert(0) += pending;
            self.end = 0;
        } else if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end = pending;
        }
        self.start = 0;
        self.scanned = self.end;
        let size = if self.quiet >= QUIET_RUN {
            QUIET
        } else if self.full_read {
            // A burst: read in big pieces while it lasts.
            CHUNK
        } else {
            self.buf.len().min(CHUNK)
        }
        .min(self.max + 1);
        // What is pending fits the read size: a long line or a burst has gone, so its memory
        // goes back. Else a line longer than the buffer (but within the cap) grows it.
        let mut want = if self.end <= size {
            size
        } else {
            self.buf.len()
        };
        if self.end == want {
            want = (want * 2).min(self.max + 1);
        }
        if want != self.buf.len() {
            if let Some(budget) = &self.budget {
                match want.saturating_sub(BASE) {
                    0 => self.grant = None,
                    extra => {
                        let (peek, room) = (&self.peek, self.max + 1 - self.end);
                        let queued = || peek.as_ref().is_some_and(|p| p(room));
                        budget.resize(&mut self.grant, extra, queued).await
                    }
                }
            }
            if self.grant.as_ref().is_some_and(Grant::is_reclaimed) {
                // Taken back while it waited for more.
                if self.end > 0 {
                    return Err(self.reclaimed_error());
                }
                self.grant = None;
                want = BASE.min(self.max + 1);
            }
            if want < self.buf.len() {
                self.buf.truncate(want);
                self.buf.shrink_to_fit();
            } else {
                self.buf.resize(want, 0);
            }
        }
        let n = loop {
            let Some(g) = &self.grant else {
                break self.inner.read(&mut self.buf[self.end..]).await?;
            };
            tokio::select! {
                r = self.inner.read(&mut self.buf[self.end..]) => break r?,
                _ = g.reclaimed() => {}
            }
            if self.end > 0 {
                return Err(self.reclaimed_error());
            }
            // Nothing unfinished, only a big read buffer: give it back and read on.
            self.grant = None;
            self.buf.truncate(BASE.min(self.max + 1));
            self.buf.shrink_to_fit();
        };
        if n == 0 {
            self.eof = true;
        }
        self.full_read = self.end + n == self.buf.len();
        self.quiet = if self.full_read {
            0
        } else {
            (self.quiet + 1).min(QUIET_RUN)
        };
        self.end += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
