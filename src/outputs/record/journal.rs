//! Which traces the recorder has open, kept on disk: `.gpumon-open` in the record directory
//! gets `+NAME` when a part file is created and `-NAME` when it is closed, and is emptied at a
//! clean stop. A daemon killed outright (SIGKILL, the OOM killer, a power cut) writes no
//! `trace_end` on the traces it was writing; the next daemon finds them here and ends each with
//! `trace_end` `daemon_killed` before anything else, so `gpumon analyze` reads no crash into
//! them. A trace whose trainer closed without bye was closed (`-NAME`) and still reads as one.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::names;
use crate::core::trace;

pub const NAME: &str = ".gpumon-open";
/// The journal being rewritten with only what is open, before it replaces `NAME`.
pub const REWRITTEN: &str = ".gpumon-open.new";
/// Why the next daemon ended a trace the last one left open.
pub const KILLED: &str = "daemon_killed";
/// A journal longer than this is not read back (it is rewritten long before).
const MAX_READ: u64 = 64 << 20;
/// Lines written before the journal is rewritten with only what is open.
const COMPACT_AFTER: usize = 4096;
/// How much of a trace's end is read to find its last line.
const TAIL: u64 = 128 * 1024;

pub struct Journal {
    path: PathBuf,
    file: Option<File>,
    lines: usize,
}

impl Journal {
    /// Ends the traces the last daemon left open in `dir`, then starts an empty journal.
    /// Returns how many it ended. Failures only cost the marker: recording goes on.
    pub fn recover(dir: &Path) -> (Self, usize) {
        let path = dir.join(NAME);
        let mut ended = 0;
        if let Some(open) = read_open(&path) {
            for name in open {
                if names::has_our_name(&name) && end_killed(&dir.join(&name)) {
                    ended += 1;
                }
            }
        }
        if ended > 0 {
            tracing::warn!(dir = %dir.display(), traces = ended, "the last daemon stopped without ending the traces it was writing (killed?): ended each with trace_end daemon_killed");
        }
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| tracing::warn!(file = %path.display(), error = %e, "cannot keep the list of open traces; a killed daemon's traces will read as crashes"))
            .ok();
        (
            Self {
                path,
                file,
                lines: 0,
            },
            ended,
        )
    }

    fn append(&mut self, line: &str) {
        if let Some(f) = &mut self.file {
            if f.write_all(line.as_bytes()).is_err() {
                self.file = None;
            }
        }
        self.lines += 1;
    }

    pub fn opened(&mut self, name: &str) {
        self.append(&format!("+{name}\n"));
    }

    /// A part closed; `open` lists the parts still open, for when the journal is rewritten.
    pub fn closed<'a>(&mut self, name: &str, open: impl Iterator<Item = &'a str>) {
        self.append(&format!("-{name}\n"));
        if self.lines < COMPACT_AFTER {
            return;
        }
        let body: String = open.map(|n| format!("+{n}\n")).collect();
        let tmp = self.path.with_file_name(REWRITTEN);
        let done = std::fs::write(&tmp, &body).and_then(|()| std::fs::rename(&tmp, &self.path));
        self.file = done
            .and_then(|()| OpenOptions::new().append(true).open(&self.path))
            .ok();
        self.lines = body.lines().count();
    }

    /// Every trace was closed: nothing is left open.
    pub fn clean(&mut self) {
        if let Some(f) = &mut self.file {
            let _ = f.set_len(0);
            let _ = f.seek(SeekFrom::Start(0));
        }
        self.lines = 0;
    }
}

/// The names the journal at `path` leaves open.
fn read_open(path: &Path) -> Option<HashSet<String>> {
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(MAX_READ)
        .read_to_string(&mut text)
        .ok()?;
    let mut open = HashSet::new();
    for l in text.lines() {
        if let Some(n) = l.strip_prefix('+') {
            open.insert(n.to_owned());
        } else if let Some(n) = l.strip_prefix('-') {
            open.remove(n);
        }
    }
    Some(open)
}

/// Ends the trace at `path` with `trace_end` `daemon_killed`, after its last whole line, unless
/// it already ends as a trace can (bye, trace_end, trace_truncated) or is not gpumon's.
fn end_killed(path: &Path) -> bool {
    let Some(ours) = names::ours(path) else {
        return false;
    };
    let Ok(mut f) = OpenOptions::new().read(true).write(true).open(path) else {
        return false;
    };
    let from = ours.len.saturating_sub(TAIL);
    let mut tail = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || f.read_to_end(&mut tail).is_err() {
        return false;
    }
    // A line cut by the kill is given up: the trace ends after its last whole line.
    let whole = tail.iter().rposition(|c| *c == b'\n').map_or(0, |i| i + 1);
    let last = tail[..whole.saturating_sub(1)]
        .rsplit(|c| *c == b'\n')
        .next()
        .unwrap_or_default();
    if ends(last) {
        return false;
    }
    let ts = ours
        .modified
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut marker = trace::ended_line(KILLED, ts);
    marker.push(b'\n');
    let keep = from + whole as u64;
    f.set_len(keep).is_ok() && f.seek(SeekFrom::Start(keep)).is_ok() && f.write_all(&marker).is_ok()
}

/// Whether `line` is one a trace may end with: the trainer's bye, or the daemon's own end.
fn ends(line: &[u8]) -> bool {
    trace::line_type(line)
        .is_some_and(|t| matches!(t.as_str(), "bye" | "trace_end" | "trace_truncated"))
}

#[cfg(test)]
mod tests;
