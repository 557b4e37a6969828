//! Writing to stderr without ever panicking or stalling on it. `eprintln!` panics when stderr is
//! a pipe whose reader has gone (`gpumon daemon 2>&1 | tee log`, then Ctrl-C ends tee too), and
//! tracing's fmt layer reports its own failed write with `eprintln!`: a log line on the signal
//! path then killed the task that was to start shutdown, and only SIGKILL ended the daemon.
//! Here a failed write is dropped and counted; the daemon has nowhere else to say it.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static LOST: AtomicU64 = AtomicU64::new(0);
static DROPPED: OnceLock<tracing_appender::non_blocking::ErrorCounter> = OnceLock::new();

/// Log lines lost since start: writes stderr refused (a closed pipe, a full disk behind a
/// redirect) and lines the log's queue dropped while stderr was stalled.
pub fn lost_writes() -> u64 {
    LOST.load(Ordering::Relaxed) + DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// Counts the lines the log's queue drops, with the writes refused, in [`lost_writes`].
pub fn count_dropped(counter: tracing_appender::non_blocking::ErrorCounter) {
    let _ = DROPPED.set(counter);
}

/// `s` and a newline on stderr, or nothing where stderr cannot be written.
pub fn line(s: &str) {
    let mut err = std::io::stderr().lock();
    if err
        .write_all(s.as_bytes())
        .and_then(|()| err.write_all(b"\n"))
        .is_err()
    {
        LOST.fetch_add(1, Ordering::Relaxed);
    }
}

/// stderr for tracing: every write reports success, so a broken pipe neither panics (through
/// the fmt layer's `eprintln!`) nor fails the event.
#[derive(Clone, Copy, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if std::io::stderr().write_all(buf).is_err() {
            LOST.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Self::Writer {
        Stderr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_always_succeeds() {
        // Whatever stderr is under the test harness, the writer reports the whole buffer.
        assert_eq!(Stderr.write(b"x\n").unwrap(), 2);
        assert!(Stderr.flush().is_ok());
    }
}
