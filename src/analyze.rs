//! `gpumon analyze TRACE...`: replays trace files through the same connection logic and detectors
//! the daemon runs, in order, with each line's own timestamp as the clock, and reports every
//! finding with the step at which it was first raised.
//!
//! Exit status (detection.md): 0 no finding, 1 at least one, 2 a trace could not be read. A bad
//! line is reported with its file and line number and the rest of the trace is still analysed.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::detect::{DetectConfig, Evidence, FindingState, Kind};
use crate::ingest::conn::{Conn, Outcome};
use crate::ingest::protocol::MAX_LINE;
use crate::store::sessions::{Peer, SessionLimits, Sessions};

/// Bad lines listed per trace; the rest are only counted.
const BAD_KEPT: usize = 20;

#[derive(Debug, Serialize)]
pub struct Report {
    pub traces: Vec<TraceReport>,
}

#[derive(Debug, Serialize)]
pub struct TraceReport {
    pub file: String,
    pub job: Option<String>,
    pub rank: Option<u64>,
    pub samples: u64,
    pub findings: Vec<FoundFinding>,
    /// Lines that were rejected, as `line N: message` (the first `BAD_KEPT`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_lines: Vec<String>,
    /// All rejected lines, including those not listed.
    pub bad_line_count: u64,
}

#[derive(Debug, Serialize)]
pub struct FoundFinding {
    pub kind: Kind,
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
}

/// A trace that could not be read at all.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct Unreadable {
    pub file: String,
    pub reason: String,
}

pub fn analyze(paths: &[PathBuf], cfg: DetectConfig) -> (Report, Vec<Unreadable>) {
    let mut traces = Vec::new();
    let mut errors = Vec::new();
    for p in paths {
        match analyze_one(p, cfg) {
            Ok(t) => traces.push(t),
            Err(e) => errors.push(e),
        }
    }
    (Report { traces }, errors)
}

fn analyze_one(path: &Path, cfg: DetectConfig) -> Result<TraceReport, Unreadable> {
    let file = path.display().to_string();
    let unreadable = |reason: String| Unreadable {
        file: file.clone(),
        reason,
    };
    let f = std::fs::File::open(path)
        .map_err(|e| unreadable(format!("cannot open: {e}; check the path")))?;
    let mut reader = BufReader::with_capacity(256 * 1024, f);
    let limits = SessionLimits {
        points: 1,
        events: 1,
        ended_kept: 1,
    };
    let mut sessions = Sessions::new(limits).with_detect(cfg);
    let mut conn = Conn::new(Peer {
        pid: 0,
        uid: 0,
        gid: 0,
    });
    let mut report = TraceReport {
        file: file.clone(),
        job: None,
        rank: None,
        samples: 0,
        findings: Vec::new(),
        bad_lines: Vec::new(),
        bad_line_count: 0,
    };
    let mut seen = HashSet::new();
    let mut clock = 0.0;
    let mut buf = Vec::new();
    let mut accepted = 0u64;
    loop {
        buf.clear();
        let n = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
            .map_err(|e| {
                unreadable(format!(
                    "read failed after line {}: {e}",
                    conn.line_number()
                ))
            })?;
        if n == 0 {
            break;
        }
        let line = strip_newline(&buf);
        if line.is_empty() {
            continue;
        }
        if buf.len() > MAX_LINE && !buf.ends_with(b"\n") {
            // Over-long: skip to the end of the line, as the daemon does.
            let mut rest = Vec::new();
            reader
                .read_until(b'\n', &mut rest)
                .map_err(|e| unreadable(format!("read failed: {e}")))?;
        }
        clock = line_ts(line).unwrap_or(clock);
        match conn.handle(line, &mut sessions, clock) {
            Outcome::Reply {
                rejected: Some(_),
                line: reply,
            } => {
                report.bad_line_count += 1;
                if report.bad_lines.len() < BAD_KEPT {
                    let n = conn.line_number();
                    report
                        .bad_lines
                        .push(format!("line {n}: {}", reply_message(&reply)));
                }
            }
            Outcome::Reply { .. } => {
                accepted += 1;
                if let Some(s) = sessions.live().next() {
                    report.job = s.hello.job.clone();
                    report.rank = s.hello.rank;
                }
            }
            Outcome::Accepted | Outcome::Bye => accepted += 1,
        }
        collect(&mut sessions, &mut seen, &mut report.findings);
    }
    if let Some(s) = sessions.live().next() {
        report.samples = s.samples;
    }
    conn.close(&mut sessions, clock);
    if let Some(s) = sessions.ended().last() {
        report.samples = s.samples;
    }
    collect(&mut sessions, &mut seen, &mut report.findings);
    if accepted == 0 {
        return Err(unreadable(format!(
            "no valid protocol line in {} line(s); a trace starts with a hello line",
            report.bad_line_count
        )));
    }
    Ok(report)
}

fn collect(sessions: &mut Sessions, seen: &mut HashSet<String>, out: &mut Vec<FoundFinding>) {
    for f in sessions.findings.drain() {
        if f.state != FindingState::Firing || !seen.insert(f.id.clone()) {
            continue;
        }
        let e = &f.evidence;
        out.push(FoundFinding {
            kind: f.kind,
            first_step: f.first_step,
            first_ts: f.first_ts,
            slope_bytes_per_step: e.slope_bytes_per_step,
            growth_bytes: e.growth_bytes,
            confidence: e.confidence,
            oom_eta_steps: e.oom_eta_steps,
            oom_eta_seconds: e.oom_eta_seconds,
            message: f.message.clone(),
            hint: f.hint.clone(),
            evidence: f.evidence.clone(),
        });
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

pub fn text(report: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for t in &report.traces {
        let _ = write!(out, "{}", t.file);
        if let Some(j) = &t.job {
            let _ = write!(out, "  job={j}");
        }
        if let Some(r) = t.rank {
            let _ = write!(out, " rank={r}");
        }
        let _ = writeln!(out, "  {} samples", t.samples);
        for b in &t.bad_lines {
            let _ = writeln!(out, "  bad {b}");
        }
        let unlisted = t.bad_line_count.saturating_sub(t.bad_lines.len() as u64);
        if unlisted > 0 {
            let _ = writeln!(out, "  ... and {unlisted} more bad lines");
        }
        if t.findings.is_empty() {
            let _ = writeln!(out, "  no findings");
        }
        for f in &t.findings {
            let step = f
                .first_step
                .map(|s| format!("step {s}"))
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(out, "  {:<13} {:<12} {}", f.kind.as_str(), step, f.message);
            if let Some(h) = &f.hint {
                let _ = writeln!(out, "  {:<13} {:<12} hint: {h}", "", "");
            }
        }
    }
    out
}
