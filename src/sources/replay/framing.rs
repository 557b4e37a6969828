//! The daemon's framing (ingest's `LineReader`) over a trace file: the file is read as a socket
//! is, so a replayed line is cut, capped and skipped exactly as a live one. The reader is the
//! daemon's async one; a file is always ready, so each fill completes in one poll on this
//! thread, with no runtime.

use std::fs::File;
use std::future::Future;
use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, ReadBuf};

use crate::sources::ingest::lines::LineReader;

/// A trace file as a socket. A file whose last line has no newline (the writer stopped in the
/// middle of it) gets one at its end, so that line is still read, and `mid_line` says so: a
/// socket's peer that closed mid-line is gone, but a trace's last line is the session's.
pub struct FileRead {
    file: File,
    last: Option<u8>,
    done: bool,
    pub mid_line: bool,
}

impl FileRead {
    pub fn new(file: File) -> Self {
        Self {
            file,
            last: None,
            done: false,
            mid_line: false,
        }
    }
}

impl AsyncRead for FileRead {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(Ok(()));
        }
        let n = loop {
            match this.file.read(buf.initialize_unfilled()) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        }?;
        if n == 0 {
            this.done = true;
            if this.last.is_some_and(|b| b != b'\n') && buf.remaining() > 0 {
                this.mid_line = true;
                buf.put_slice(b"\n");
            }
            return Poll::Ready(Ok(()));
        }
        this.last = buf.initialize_unfilled().get(n - 1).copied();
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

/// `LineReader::fill` on a file: done in one poll, since the file never makes it wait.
pub fn fill(reader: &mut LineReader<FileRead>) -> std::io::Result<()> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut fut = std::pin::pin!(reader.fill());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(r) => r,
        // Only a line budget makes the reader wait, and a replay's reader has none.
        Poll::Pending => Err(std::io::Error::other("the trace reader waited on a file")),
    }
}
