//! One run of traces (a trace, or the traces that continue it after a daemon restart) read as
//! its connection: framed by the daemon's reader, its recorder lines taken as notes, its other
//! lines parsed by the protocol, each handed out with its own timestamp so the node can
//! interleave its runs by time.

use std::path::PathBuf;

use super::framing::{self, FileRead};
use super::{Trace, Unreadable, OPEN};
use crate::core::input::Note;
use crate::core::message::Message;
use crate::core::model::Timestamp;
use crate::core::store::sessions::nvml::NvmlFigure;
use crate::core::trace::{self, RecorderLine};
use crate::sources::ingest::conn::Conn;
use crate::sources::ingest::lines::{Frame, LineReader};
use crate::sources::ingest::protocol::{self, Rejection, MAX_LINE};

/// Bad lines listed per trace; the rest are only counted.
const BAD_KEPT: usize = 20;

/// What the run brings next.
// Nearly every step is a line and one is held per run: boxing it would add an allocation per
// line for no room saved.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step {
    /// A parsed line, with its `seq`, at its time.
    Line {
        msg: Message,
        seq: Option<u64>,
        ts: Timestamp,
    },
    /// Its last file is read: the connection ends at `ts`.
    End { ts: Timestamp },
}

pub(super) struct Cursor {
    files: Vec<PathBuf>,
    /// The file being read, by index into `files`; `files.len()` once all are.
    k: usize,
    reader: Option<LineReader<FileRead>>,
    /// Lines of the file, recorder lines and blank ones included: what an editor shows.
    file_line: u64,
    /// How a bad line of a later file names it.
    at: String,
    pub trace: Trace,
    pub conn: Conn,
    /// Recorder notes read ahead of the next line, applied before it.
    pub notes: Vec<Note>,
    /// The replay's clock for this connection: the last line taken, or the close recorded.
    pub clock: Timestamp,
    /// Lines the core took.
    pub accepted: u64,
}

impl Cursor {
    pub fn new(files: Vec<PathBuf>, conn: Conn) -> Self {
        let file = files
            .first()
            .map(|f| f.display().to_string())
            .unwrap_or_default();
        Self {
            files,
            k: 0,
            reader: None,
            file_line: 0,
            at: String::new(),
            trace: Trace::new(file),
            conn,
            notes: Vec::new(),
            clock: 0.0,
            accepted: 0,
        }
    }

    /// A rejected line, listed (the first `BAD_KEPT`) and counted.
    pub fn bad(&mut self, r: &Rejection) {
        self.bad_line(format!("{} ({})", r.message, r.code.as_str()));
    }

    fn bad_line(&mut self, why: String) {
        self.trace.bad_line_count += 1;
        if self.trace.bad_lines.len() < BAD_KEPT {
            let line = format!("{}line {}: {why}", self.at, self.file_line);
            self.trace.bad_lines.push(line);
        }
    }

    /// Opens the next file of the run; false when none is left.
    fn open_next(&mut self) -> Result<bool, Unreadable> {
        let Some(path) = self.files.get(self.k) else {
            return Ok(false);
        };
        let file = path.display().to_string();
        let f = super::open::open_trace(path).map_err(|reason| Unreadable {
            file: file.clone(),
            reason,
        })?;
        // The recorder locks the part it is writing: such a trace has no end yet, so no crash.
        let open = matches!(
            rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared),
            Err(rustix::io::Errno::WOULDBLOCK)
        );
        // How the run ended is how its last file ended.
        self.trace.truncated = None;
        self.trace.ended = open.then(|| OPEN.to_string());
        if self.k > 0 {
            self.at = format!(
                "{} ",
                path.file_name()
                    .map_or(file.clone(), |n| n.to_string_lossy().into_owned())
            );
            self.trace.continued_in.push(file);
        }
        self.file_line = 0;
        self.reader = Some(LineReader::new(FileRead::new(f), MAX_LINE));
        Ok(true)
    }

    /// Reads on to the run's next line for the core, taking the recorder's lines and refusing
    /// bad ones on the way.
    pub fn next(&mut self) -> Result<Step, Unreadable> {
        loop {
            if self.reader.is_none() && !self.open_next()? {
                return Ok(Step::End { ts: self.clock });
            }
            // Out of `self` while a line borrows it, put back after.
            let Some(mut reader) = self.reader.take() else {
                continue;
            };
            if let Err(e) = framing::fill(&mut reader) {
                return Err(Unreadable {
                    file: self
                        .files
                        .get(self.k)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    reason: format!("read failed after line {}: {e}", self.file_line),
                });
            }
            let step = match reader.next_buffered() {
                None => None,
                Some(Frame::Eof { .. }) => {
                    if reader.get_ref().mid_line {
                        // The writer stopped in the middle of the last line.
                        self.trace.truncated = Some("the trace ends mid-line".into());
                    }
                    self.k += 1;
                    continue;
                }
                Some(Frame::TooLong { len }) => {
                    self.file_line += 1;
                    self.bad_line(format!(
                        "line of {len} bytes exceeds {MAX_LINE}; it was skipped (line_too_long)"
                    ));
                    None
                }
                Some(Frame::Line(line)) => {
                    self.file_line += 1;
                    self.take(line)
                }
            };
            self.reader = Some(reader);
            if let Some(step) = step {
                return Ok(step);
            }
        }
    }

    /// One line of the file: a step for the core, or None when it was the recorder's, blank,
    /// or refused.
    fn take(&mut self, line: &[u8]) -> Option<Step> {
        if line.is_empty() {
            return None;
        }
        if self.k > 0 && self.file_line == 1 && trace::is_hello(line) {
            // The same client going on (stitch.rs checked its instance): one session.
            return None;
        }
        match trace::read_recorder_line(line) {
            // Not as a daemon writes it: refused by name, the rest of the trace read.
            Some(Err(why)) => {
                self.bad_line(why);
                return None;
            }
            Some(Ok(r)) => {
                self.recorder(r);
                return None;
            }
            None => {}
        }
        match protocol::parse_numbered(line) {
            Ok((msg, seq)) => {
                // The line's own time, when it is one a daemon could have taken.
                let ts = message_ts(&msg)
                    .or_else(|| line_ts(line))
                    .filter(|t| trace::valid_ts(*t))
                    .unwrap_or(self.clock);
                Some(Step::Line { msg, seq, ts })
            }
            Err(r) => {
                self.bad(&r);
                None
            }
        }
    }

    /// A line the recorder wrote beside the trainer's.
    fn recorder(&mut self, r: RecorderLine) {
        match r {
            // The recorder's own closing line: it says why recording stopped.
            RecorderLine::Truncated(reason) => {
                self.trace.truncated = Some(format!("recording stopped: {reason}"));
            }
            RecorderLine::Gpu(gpu) => {
                self.notes.push(Note::Gpu(gpu));
                self.trace.gpu = Some(gpu);
            }
            // The daemon stopped while the session was open: no crash is read into this end.
            RecorderLine::Ended(reason) => self.trace.ended = Some(reason),
            RecorderLine::Resumes(_) => {}
            RecorderLine::Host(h) => self.trace.host = Some(h),
            // The header's, which every part repeats: the first one read is the session's.
            RecorderLine::Peer(uid) => self.trace.uid = self.trace.uid.or(Some(uid)),
            // The close the daemon saw: the crash is dated by it, not by the last sample.
            RecorderLine::Closed(ts) => self.clock = ts,
            RecorderLine::Nvml(used, ts) => {
                let figure = used.zip(ts).map(|(used, ts)| NvmlFigure { used, ts });
                self.notes.push(Note::Nvml(figure));
            }
        }
    }
}

/// The time a parsed line carries (a hello's and some byes' are not kept by the parse).
fn message_ts(msg: &Message) -> Option<f64> {
    match msg {
        Message::Sample(s) => Some(s.ts),
        Message::Event(e) => Some(e.ts),
        Message::Attribution(a) => Some(a.ts),
        Message::Armed(a) => Some(a.ts),
        Message::Peak(p) => Some(p.ts),
        Message::Bye { ts } => *ts,
        Message::Hello(_) => None,
    }
}

/// The line's own `ts`, for the lines whose parse keeps none. A cheap look, not a parse.
fn line_ts(line: &[u8]) -> Option<f64> {
    #[derive(serde::Deserialize)]
    struct Ts {
        ts: f64,
    }
    serde_json::from_slice::<Ts>(line).ok().map(|t| t.ts)
}
