//! `gpumon analyze TRACE...`: replays trace files through the same connection logic and core
//! (`Core`, here without the aggregator's thread) the daemon runs, in order, with each line's
//! own timestamp as the clock, and reports every finding with the step at which it was first
//! raised.
//!
//! Exit status (detection.md): 0 no finding, 1 at least one, 2 a trace could not be read. A bad
//! line is reported with its file and line number and the rest of the trace is still analysed.
//!
//! A leak the trainer attributed (an `attribution` line in the trace) is reported with its
//! sites: the text lists the top ones under the finding, the JSON carries the whole attribution.
//! A near_limit finding an armed trainer reported the step peak for (a `peak` line) is reported
//! with what was live at the peak, the same way.

mod expand;
mod job_text;
mod jobs;
mod open;
mod stitch;
mod text;

pub use text::text;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::core::apply::Core;
use crate::core::detect::attribution::Attribution;
use crate::core::detect::explanation::Explanation;
use crate::core::detect::peak::Peak;
use crate::core::detect::{DetectConfig, Evidence, Finding, FindingState, Kind};
use crate::core::input::{Closing, Note};
use crate::core::store::sessions::nvml::NvmlFigure;
use crate::core::store::sessions::{SessionLimits, Sessions};
use crate::core::trace::{self, RecorderLine, MAX_LINE};
use crate::core::trainer::EventKind;
use crate::core::trainer::Peer;
use crate::sources::ingest::conn::{Conn, Outcome};

use expand::expand;

/// Bad lines listed per trace; the rest are only counted.
const BAD_KEPT: usize = 20;

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub traces: Vec<TraceReport>,
    /// The traces' sessions grouped by run (jobs.md), each judged as one: the first failure
    /// with its host and file, and the ranks that followed it.
    #[serde(default)]
    pub jobs: Vec<crate::core::jobs::JobView>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TraceReport {
    pub file: String,
    /// Traces that continue this one, in order: the same client's connections after a daemon
    /// restart or a reconnect (each names the one before in a `trace_resumes` line).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub continued_in: Vec<String>,
    /// Lines a later trace of the run held again (resent after the restart, the same `seq`):
    /// counted once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub duplicates: u64,
    pub job: Option<String>,
    pub rank: Option<u64>,
    /// The host the daemon recorded on (its `trace_host` line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The session's uid as the daemon read it off the socket (its `trace_peer` line); none in
    /// traces recorded before traces said it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// What the trace says of its session as a member of its job, for `jobs`.
    #[serde(skip)]
    pub member: Option<jobs::Facts>,
    /// The GPU the daemon resolved the trainer's `gpu_uuid` to when it recorded the trace (its
    /// NVML index; a MIG instance's parent), as its live findings and metrics named it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::core::model::gpu_label"
    )]
    pub gpu: Option<u32>,
    /// The trainer's GPU was a unified-memory device (`trace_unified`): its samples were judged
    /// against the device's figures the daemon noted (the host's memory), as live.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unified: bool,
    pub samples: u64,
    pub findings: Vec<FoundFinding>,
    /// Lines that were rejected, as `line N: message` (the first `BAD_KEPT`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bad_lines: Vec<String>,
    /// All rejected lines, including those not listed.
    pub bad_line_count: u64,
    /// The trace stops short of the session's end: the recorder stopped it (its reason, from a
    /// `trace_truncated` line) or it ends mid-line. Its end is then no sign of a crash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<String>,
    /// The daemon ended the trace while the session was open (`trace_end`: `daemon_stopped`),
    /// or the trace is still being written (`open`). Its end is then no sign of a crash either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FoundFinding {
    pub kind: Kind,
    /// As on the daemon's findings: the GPU index (from the trace's `trace_gpu` line) and the
    /// device the trainer named.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::core::model::gpu_label"
    )]
    pub gpu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    pub first_step: Option<u64>,
    pub first_ts: f64,
    pub slope_bytes_per_step: Option<f64>,
    pub growth_bytes: Option<u64>,
    pub confidence: Option<f64>,
    pub oom_eta_steps: Option<u64>,
    pub oom_eta_seconds: Option<f64>,
    pub message: String,
    pub hint: Option<String>,
    pub evidence: Evidence,
    /// Where the growing memory was allocated, as the trainer reported it (leaks only): the
    /// latest the finding carried before the trace ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attribution: Option<Attribution>,
    /// near_limit: what was live at the step peak, by site, as the armed trainer reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak: Option<Peak>,
    /// OOMs: what the trainer read in its allocator at the OOM (pattern, the line that asked,
    /// live sites, remedies), as its `oom` event carried it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Box<Explanation>>,
    /// A failure that followed another's: its own OOM, or the job's first failure (`jobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consequence_of: Option<crate::core::jobs::ConsequenceOf>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A trace that could not be read at all.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct Unreadable {
    pub file: String,
    pub reason: String,
}

/// `ended` of a trace that a running daemon still writes (it holds a lock on the file).
pub const OPEN: &str = "open";

pub fn analyze(paths: &[PathBuf], cfg: DetectConfig) -> (Report, Vec<Unreadable>) {
    let mut traces = Vec::new();
    let mut errors = Vec::new();
    for run in stitch::runs(expand(paths, &mut errors)) {
        match analyze_run(&run, cfg) {
            Ok(t) => traces.push(t),
            Err(e) => errors.push(e),
        }
    }
    let jobs = jobs::judge(&mut traces, cfg);
    (Report { traces, jobs }, errors)
}

/// One trace, or a run of traces that continue one another (stitch.rs), replayed as one
/// session: a later file's hello is the same client's and is not read again, and lines the
/// client resent after the restart (the same `seq`) are counted once.
fn analyze_run(paths: &[PathBuf], cfg: DetectConfig) -> Result<TraceReport, Unreadable> {
    let Some(first) = paths.first() else {
        return Err(Unreadable {
            file: String::new(),
            reason: "no trace given".into(),
        });
    };
    let limits = SessionLimits {
        points: 1,
        events: 1,
        ended_kept: 1,
    };
    // The daemon's own core, run on this thread: the same rules, transitions and GPUs.
    let mut core = Core::with_sessions(Sessions::new(limits).with_detect(cfg));
    // Acknowledging, so a resent line (an `instance` and `seq` already taken) is dropped.
    let mut conn = Conn::new(Peer {
        pid: 0,
        uid: 0,
        gid: 0,
    })
    .acking(std::sync::Arc::default());
    let mut report = TraceReport {
        file: first.display().to_string(),
        continued_in: Vec::new(),
        duplicates: 0,
        job: None,
        rank: None,
        host: None,
        uid: None,
        member: None,
        gpu: None,
        unified: false,
        samples: 0,
        findings: Vec::new(),
        bad_lines: Vec::new(),
        bad_line_count: 0,
        truncated: None,
        ended: None,
    };
    let mut seen = HashMap::new();
    let mut clock = 0.0;
    let mut accepted = 0u64;
    for (k, path) in paths.iter().enumerate() {
        let file = path.display().to_string();
        if k > 0 {
            report.continued_in.push(file.clone());
        }
        let unreadable = |reason: String| Unreadable {
            file: file.clone(),
            reason,
        };
        let f = open::open_trace(path).map_err(unreadable)?;
        // The recorder locks the part it is writing: such a trace has no end yet, so no crash.
        let open = matches!(
            rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared),
            Err(rustix::io::Errno::WOULDBLOCK)
        );
        // How the run ended is how its last file ended.
        report.truncated = None;
        report.ended = open.then(|| OPEN.to_string());
        let mut reader = BufReader::with_capacity(256 * 1024, f);
        let mut buf = Vec::new();
        // Lines of the file, recorder lines and blank ones included: what an editor shows.
        let mut file_line = 0u64;
        // Bad lines of a later file name it.
        let at = if k == 0 {
            String::new()
        } else {
            format!(
                "{} ",
                path.file_name()
                    .map_or(file.clone(), |n| n.to_string_lossy().into_owned())
            )
        };
        loop {
            buf.clear();
            let n = (&mut reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|e| unreadable(format!("read failed after line {file_line}: {e}")))?;
            if n == 0 {
                break;
            }
            file_line += 1;
            if buf.len() > MAX_LINE && !buf.ends_with(b"\n") {
                // Over-long: skipped to its end in the reader's own buffer, whatever its length
                // (a sparse file holds gigabytes of one line in a few KB on disk).
                let (rest, ended) = skip_line(&mut reader)
                    .map_err(|e| unreadable(format!("read failed in line {file_line}: {e}")))?;
                if !ended {
                    report.truncated = Some("the trace ends mid-line".into());
                }
                report.bad_line_count += 1;
                if report.bad_lines.len() < BAD_KEPT {
                    let len = buf.len() as u64 + rest;
                    report.bad_lines.push(format!(
                        "{at}line {file_line}: {len} bytes long, over the limit of {MAX_LINE} bytes; it was skipped (line_too_long)"
                    ));
                }
                continue;
            }
            if !buf.ends_with(b"\n") {
                // The last line has no newline: the writer stopped in the middle of it.
                report.truncated = Some("the trace ends mid-line".into());
            }
            let line = strip_newline(&buf);
            if line.is_empty() {
                continue;
            }
            if k > 0 && file_line == 1 && trace::is_hello(line) {
                // The same client going on (stitch.rs checked its instance): one session.
                continue;
            }
            let recorded = match trace::read_recorder_line(line) {
                Some(Err(why)) => {
                    // Not as a daemon writes it: refused by name, the rest of the trace read.
                    report.bad_line_count += 1;
                    if report.bad_lines.len() < BAD_KEPT {
                        report
                            .bad_lines
                            .push(format!("{at}line {file_line}: {why}"));
                    }
                    continue;
                }
                Some(Ok(r)) => Some(r),
                None => None,
            };
            match recorded {
                // The recorder's own closing line, not the trainer's: it says why recording stopped.
                Some(RecorderLine::Truncated(reason)) => {
                    report.truncated = Some(format!("recording stopped: {reason}"));
                    continue;
                }
                Some(RecorderLine::Gpu(gpu)) => {
                    core.note(conn.link(), Note::Gpu(gpu));
                    report.gpu = Some(gpu);
                    continue;
                }
                // The daemon stopped while the session was open: no crash is read into this end.
                Some(RecorderLine::Ended(reason)) => {
                    report.ended = Some(reason);
                    continue;
                }
                Some(RecorderLine::Resumes(_)) => continue,
                Some(RecorderLine::Host(h)) => {
                    report.host = Some(h);
                    continue;
                }
                // The header's, which every part repeats: the first one read is the session's.
                Some(RecorderLine::Peer(uid)) => {
                    report.uid = report.uid.or(Some(uid));
                    continue;
                }
                // The close the daemon saw: the crash is dated by it, not by the last sample.
                Some(RecorderLine::Closed(ts)) => {
                    clock = ts;
                    continue;
                }
                Some(RecorderLine::Unified(room)) => {
                    report.unified |= room.is_some();
                    core.note(conn.link(), Note::Unified(room));
                    continue;
                }
                Some(RecorderLine::Nvml(used, ts)) => {
                    let figure = used.zip(ts).map(|(used, ts)| NvmlFigure { used, ts });
                    core.note(conn.link(), Note::Nvml(figure));
                    continue;
                }
                None => {}
            }
            // The line's own time, when it is one a daemon could have taken: a line refused
            // (a `ts` of -1e308 among them) moves no clock, so dates no crash.
            let at_ts = line_ts(line)
                .filter(|t| trace::valid_ts(*t))
                .unwrap_or(clock);
            let outcome = conn.handle(line, &mut core, at_ts);
            if !matches!(
                outcome,
                Outcome::Reply {
                    rejected: Some(_),
                    ..
                }
            ) {
                clock = at_ts;
            }
            match outcome {
                Outcome::Reply {
                    rejected: Some(_),
                    line: reply,
                } => {
                    report.bad_line_count += 1;
                    if report.bad_lines.len() < BAD_KEPT {
                        report
                            .bad_lines
                            .push(format!("{at}line {file_line}: {}", reply_message(&reply)));
                    }
                }
                Outcome::Reply { .. } => {
                    accepted += 1;
                    if let Some(s) = core.sessions().live().next() {
                        report.job = s.hello.job.clone();
                        report.rank = s.hello.rank;
                    }
                }
                Outcome::Accepted | Outcome::Bye => accepted += 1,
                // Sent again after a restart: in the earlier trace already.
                Outcome::Duplicate => report.duplicates += 1,
            }
            collect(&mut core, &mut seen, &mut report.findings);
        }
    }
    let file = report.file.clone();
    let unreadable = |reason: String| Unreadable { file, reason };
    if let Some(s) = core.sessions().live().next() {
        report.samples = s.samples;
    }
    // The daemon closed the connection for going quiet (its `idle_timeout` event ends the
    // trace): the trainer may be alive, as the daemon itself recorded no crash.
    let idle = core
        .sessions()
        .live()
        .next()
        .and_then(|s| s.events.back())
        .is_some_and(|e| e.kind == EventKind::IdleTimeout);
    if report.truncated.is_some() || report.ended.is_some() || idle {
        // What happened after the trace stops is unknown: no crash is read into it.
        conn.close(&mut core, Closing::DaemonStopped, clock);
    } else {
        conn.close(&mut core, Closing::Crash, clock);
    }
    if let Some(s) = core.sessions().ended().last() {
        report.samples = s.samples;
    }
    collect(&mut core, &mut seen, &mut report.findings);
    report.member = jobs::facts(&core, &report);
    // An answer that could not attribute stays on the session, not on the finding: it is
    // reported under the finding it answered when that has nothing better.
    if let Some(a) = core
        .sessions()
        .ended()
        .last()
        .and_then(|s| s.attribution.as_ref())
    {
        let answered = a.finding.as_ref().and_then(|id| seen.get(id));
        if let Some(f) = answered.and_then(|i| report.findings.get_mut(*i)) {
            if f.attribution.is_none() {
                // Its message says why no line is named, as the live finding's does.
                if let Some(why) = crate::core::detect::message::unattributed(a) {
                    // Before the forecast, as the live message has it.
                    let forecast = crate::core::detect::message::forecast(&f.evidence);
                    let at = if f.message.ends_with(&forecast) {
                        f.message.len() - forecast.len()
                    } else {
                        f.message.len()
                    };
                    f.message.insert_str(at, &format!("; {why}"));
                }
            }
            f.attribution.get_or_insert_with(|| a.clone());
        }
    }
    if accepted == 0 {
        return Err(unreadable(format!(
            "no valid protocol line in {} line(s); a trace starts with a hello line",
            report.bad_line_count
        )));
    }
    Ok(report)
}

/// Adds each finding the first time it fires; `seen` maps its id to its place in `out`. An
/// attribution comes after the finding was raised (the trainer records a window first), so
/// later transitions of a finding already reported (refreshed, resolved) bring it in.
fn collect(core: &mut Core, seen: &mut HashMap<String, usize>, out: &mut Vec<FoundFinding>) {
    for f in core.transitions() {
        if let Some(found) = seen.get(&f.id).and_then(|i| out.get_mut(*i)) {
            if f.kind == Kind::Oom && f.state == FindingState::Firing {
                // The run went on from it: the message and evidence say so now.
                found.message = f.message;
                found.hint = f.hint;
                found.explanation = f.evidence.explanation.clone();
                found.evidence = f.evidence;
            } else if f.attribution.is_some() {
                found.attribution = f.attribution;
            } else if f.peak.is_some() {
                // Its message names the peak's top site from then on.
                found.message = f.message;
                found.peak = f.peak;
            }
            continue;
        }
        if f.state != FindingState::Firing {
            continue;
        }
        seen.insert(f.id.clone(), out.len());
        out.push(found(f));
    }
}

fn found(f: Finding) -> FoundFinding {
    let e = &f.evidence;
    FoundFinding {
        kind: f.kind,
        gpu: f.gpu,
        gpu_uuid: f.subject.gpu_uuid.clone(),
        first_step: f.first_step,
        first_ts: f.first_ts,
        slope_bytes_per_step: e.slope_bytes_per_step,
        growth_bytes: e.growth_bytes,
        confidence: e.confidence,
        oom_eta_steps: e.oom_eta_steps,
        oom_eta_seconds: e.oom_eta_seconds,
        message: f.message,
        hint: f.hint,
        explanation: f.evidence.explanation.clone(),
        evidence: f.evidence,
        attribution: f.attribution,
        peak: f.peak,
        consequence_of: f.consequence_of,
    }
}

/// Reads past the rest of a line, a buffer at a time: memory stays the reader's buffer whatever
/// the line's length. The bytes skipped (the newline not counted), and whether a newline ended
/// them (else the file did).
fn skip_line(reader: &mut impl BufRead) -> std::io::Result<(u64, bool)> {
    let mut skipped = 0u64;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((skipped, false));
        }
        if let Some(i) = memchr::memchr(b'\n', chunk) {
            reader.consume(i + 1);
            return Ok((skipped + i as u64, true));
        }
        let n = chunk.len();
        reader.consume(n);
        skipped += n as u64;
    }
}

fn strip_newline(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.strip_suffix(b"\r").unwrap_or(b)
}

/// The line's own `ts`, the replay clock. A cheap look, not a parse: the full parse follows.
fn line_ts(line: &[u8]) -> Option<f64> {
    #[derive(serde::Deserialize)]
    struct Ts {
        ts: f64,
    }
    serde_json::from_slice::<Ts>(line).ok().map(|t| t.ts)
}

fn reply_message(reply: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(reply)
        .ok()
        .and_then(|v| {
            Some(format!(
                "{} ({})",
                v.get("message")?.as_str()?,
                v.get("code")?.as_str()?
            ))
        })
        .unwrap_or_else(|| String::from_utf8_lossy(reply).trim().to_string())
}
