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
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[derive(Debug, PartialEq, Eq)]
    enum Owned {
        Line(Vec<u8>),
        TooLong(usize),
        Eof(usize),
    }

    /// All frames, taken in batches as the server does.
    async fn frames(input: Vec<u8>, max: usize) -> Vec<Owned> {
        let (mut w, r) = tokio::io::duplex(64);
        tokio::spawn(async move {
            // Written in small pieces so lines straddle reads.
            for piece in input.chunks(7) {
                w.write_all(piece).await.unwrap();
            }
        });
        let mut reader = LineReader::new(r, max);
        let mut out = Vec::new();
        loop {
            reader.fill().await.unwrap();
            while let Some(f) = reader.next_buffered() {
                let end = matches!(f, Frame::Eof { .. });
                out.push(match f {
                    Frame::Line(l) => Owned::Line(l.to_vec()),
                    Frame::TooLong { len } => Owned::TooLong(len),
                    Frame::Eof { partial } => Owned::Eof(partial),
                });
                if end {
                    return out;
                }
            }
        }
    }

    #[tokio::test]
    async fn splits_lines_and_reports_a_half_line_at_eof() {
        let got = frames(b"one\r\ntwo\n\nthree".to_vec(), 100).await;
        assert_eq!(
            got,
            vec![
                Owned::Line(b"one".to_vec()),
                Owned::Line(b"two".to_vec()),
                Owned::Line(vec![]),
                Owned::Eof(5),
            ]
        );
    }

    #[tokio::test]
    async fn long_lines_are_skipped_and_the_next_line_survives() {
        let mut input = vec![b'x'; 10_000];
        input.extend_from_slice(b"\nok\n");
        input.extend(vec![b'y'; 300]);
        let got = frames(input, 100).await;
        assert_eq!(
            got,
            vec![
                Owned::TooLong(10_000),
                Owned::Line(b"ok".to_vec()),
                Owned::Eof(300)
            ]
        );
    }

    #[tokio::test]
    async fn lines_up_to_the_cap_are_kept_even_past_the_read_size() {
        for len in [100, CHUNK + 10, 3 * CHUNK] {
            let mut input = vec![b'a'; len];
            input.extend_from_slice(b"\nb\n");
            let got = frames(input, 3 * CHUNK).await;
            assert_eq!(got[0], Owned::Line(vec![b'a'; len]), "len {len}");
            assert_eq!(got[1], Owned::Line(b"b".to_vec()));
        }
        let mut over = vec![b'a'; 3 * CHUNK + 1];
        over.push(b'\n');
        let got = frames(over, 3 * CHUNK).await;
        assert_eq!(got[0], Owned::TooLong(3 * CHUNK + 1));
    }

    #[tokio::test]
    async fn a_reader_that_fills_its_buffer_is_backlogged_until_it_catches_up() {
        let (mut w, r) = tokio::io::duplex(4096);
        w.write_all(&b"a\n".repeat(100)).await.unwrap();
        // A cap of 100 makes a 101-byte buffer: 200 bytes take two full reads and a short one.
        let mut reader = LineReader::new(r, 100);
        let mut seen = Vec::new();
        while seen.len() < 100 {
            reader.fill().await.unwrap();
            while let Some(Frame::Line(_)) = reader.next_buffered() {
                seen.push(());
            }
            let caught_up = seen.len() == 100;
            assert_eq!(
                reader.backlogged(),
                !caught_up,
                "after {} lines",
                seen.len()
            );
        }
    }

    #[tokio::test]
    async fn what_one_read_brought_is_one_batch() {
        let (mut w, r) = tokio::io::duplex(4096);
        w.write_all(b"a\nbb\r\nc\nhalf").await.unwrap();
        let mut reader = LineReader::new(r, 100);
        reader.fill().await.unwrap();
        let (mut batch, mut ranges) = (Vec::new(), Vec::new());
        while let Some(Frame::Line(l)) = reader.next_buffered() {
            batch.push(l.to_vec());
            ranges.push(reader.last_line());
        }
        assert_eq!(batch, [b"a".to_vec(), b"bb".to_vec(), b"c".to_vec()]);
        // Until the next read, every line of the batch can be looked at again.
        let again: Vec<_> = ranges
            .into_iter()
            .map(|r| reader.bytes(r).to_vec())
            .collect();
        assert_eq!(again, batch);
        w.write_all(b"\n").await.unwrap();
        drop(w);
        assert_eq!(reader.next().await.unwrap(), Frame::Line(b"half"));
        assert_eq!(reader.next().await.unwrap(), Frame::Eof { partial: 0 });
    }

    /// A burst (the history a trainer sends at connect) reads in 16 KiB pieces; a trainer that
    /// then keeps up is read with 4 KiB again, and every line comes through either way.
    #[tokio::test]
    async fn the_read_buffer_grows_for_a_burst_and_shrinks_once_quiet() {
        let (mut w, r) = tokio::io::duplex(1 << 20);
        let mut reader = LineReader::new(r, 64 * 1024);
        assert_eq!(reader.buf.len(), QUIET);
        let line = format!("{}\n", "s".repeat(500));
        w.write_all(line.repeat(200).as_bytes()).await.unwrap();
        let mut lines = 0;
        while lines < 200 {
            reader.fill().await.unwrap();
            while let Some(Frame::Line(l)) = reader.next_buffered() {
                assert_eq!(l.len(), 500);
                lines += 1;
            }
        }
        assert_eq!(reader.buf.len(), CHUNK);
        for k in 0..QUIET_RUN + 1 {
            w.write_all(line.as_bytes()).await.unwrap();
            assert_eq!(
                reader.next().await.unwrap(),
                Frame::Line(&line.as_bytes()[..500])
            );
            // The burst's own last read may have been short: one quiet read already.
            if k + 2 < QUIET_RUN {
                assert_eq!(reader.buf.len(), CHUNK, "after {k} quiet reads");
            }
        }
        assert_eq!(reader.buf.len(), QUIET);
    }
}
