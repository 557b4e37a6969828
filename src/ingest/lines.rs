//! Newline framing with a hard cap: a line longer than the cap is skipped up to its newline
//! without ever being buffered, so a client cannot make the daemon hold more than one cap's
//! worth of bytes per connection.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What the reader found next.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A complete line, newline stripped (a trailing `\r` too).
    Line(Vec<u8>),
    /// A line over the cap was skipped; `len` is how long it was (newline excluded).
    TooLong { len: usize },
    /// The peer closed; `partial` is how many bytes of an unterminated last line were dropped.
    Eof { partial: usize },
}

pub struct LineReader<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            max,
            buf: Vec::new(),
        }
    }

    pub async fn next(&mut self) -> std::io::Result<Frame> {
        self.buf.clear();
        let mut skipped: Option<usize> = None;
        loop {
            let chunk = self.inner.fill_buf().await?;
            if chunk.is_empty() {
                let partial = skipped.unwrap_or(0) + self.buf.len();
                self.buf.clear();
                return Ok(Frame::Eof { partial });
            }
            let (take, done) = match memchr(chunk) {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            match skipped.as_mut() {
                Some(n) => *n += take,
                None if self.buf.len() + take > self.max => {
                    skipped = Some(self.buf.len() + take);
                    self.buf.clear();
                    self.buf.shrink_to(self.max.min(4096));
                }
                None => self.buf.extend_from_slice(&chunk[..take]),
            }
            self.inner.consume(if done { take + 1 } else { take });
            if done {
                return Ok(match skipped {
                    Some(len) => Frame::TooLong { len },
                    None => {
                        if self.buf.last() == Some(&b'\r') {
                            self.buf.pop();
                        }
                        Frame::Line(std::mem::take(&mut self.buf))
                    }
                });
            }
        }
    }
}

fn memchr(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncWriteExt, BufReader};

    async fn frames(input: Vec<u8>, max: usize) -> Vec<Frame> {
        let (mut w, r) = tokio::io::duplex(1024);
        tokio::spawn(async move {
            // Written in small pieces so lines straddle reads.
            for piece in input.chunks(7) {
                w.write_all(piece).await.unwrap();
            }
        });
        let mut reader = LineReader::new(BufReader::with_capacity(64, r), max);
        let mut out = Vec::new();
        loop {
            let f = reader.next().await.unwrap();
            let end = matches!(f, Frame::Eof { .. });
            out.push(f);
            if end {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn splits_lines_and_reports_a_half_line_at_eof() {
        let got = frames(b"one\r\ntwo\n\nthree".to_vec(), 100).await;
        assert_eq!(
            got,
            vec![
                Frame::Line(b"one".to_vec()),
                Frame::Line(b"two".to_vec()),
                Frame::Line(vec![]),
                Frame::Eof { partial: 5 },
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
                Frame::TooLong { len: 10_000 },
                Frame::Line(b"ok".to_vec()),
                Frame::Eof { partial: 300 },
            ]
        );
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_cap_is_accepted() {
        let mut input = vec![b'a'; 100];
        input.push(b'\n');
        let got = frames(input, 100).await;
        assert_eq!(got[0], Frame::Line(vec![b'a'; 100]));
    }
}
