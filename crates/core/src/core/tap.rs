//! Where accepted trainer lines go besides the store: a tap (the recorder, `--record-dir`) that
//! ingest writes each session's lines into, in order, as received. Defined here so ingest needs
//! no output: the daemon hands it the recorder.

use crate::core::model::Timestamp;

pub trait Tap: Send + Sync {
    /// Starts the trace of a session whose hello was just accepted; `header` is what each part
    /// of it begins with (the hello and, when known, its `trace_gpu` line).
    fn start(
        &self,
        session: &str,
        job: Option<&str>,
        rank: Option<u64>,
        started: Timestamp,
        header: &[u8],
    ) -> Box<dyn SessionTap>;
}

/// One session's trace. Dropping it ends the trace (what is buffered still goes out).
pub trait SessionTap: Send {
    /// Appends one accepted line (without its newline), numbered `seq` by the client (0: not),
    /// or a note of the daemon's own (`trace_nvml`, `trace_end`, the idle event).
    fn write(&mut self, line: &[u8], seq: u64);
    /// Whether the session's lines still go to its trace (not stopped for a cap or an error).
    fn recording(&self) -> bool;
    /// The highest `seq` whose line is in the file: acknowledgements go no further.
    fn durable(&self) -> u64;
}
