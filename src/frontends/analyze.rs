//! `gpumon analyze TRACE...`: renders what the replay source (sources::replay) found when it
//! replayed the traces as their daemons took them: each trace's findings as the core holds
//! them (with severity and state, as the daemon's API gives them) and the jobs' verdicts.
//!
//! Exit status (detection.md): 0 no finding, 1 at least one, 2 a trace could not be read. A bad
//! line is reported with its file and line number and the rest of the trace is still analysed.
//!
//! A leak the trainer attributed (an `attribution` line in the trace) is reported with its
//! sites: the text lists the top ones under the finding, the JSON carries the whole attribution.
//! A near_limit finding an armed trainer reported the step peak for (a `peak` line) is reported
//! with what was live at the peak, the same way.

mod job_text;
mod text;

pub use text::text;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::core::detect::attribution::Attribution;
use crate::core::detect::explanation::Explanation;
use crate::core::detect::findings::Severity;
use crate::core::detect::peak::Peak;
use crate::core::detect::{DetectConfig, Evidence, FindingState, Kind};
use crate::sources::replay::{self, Found, Trace};

pub use crate::sources::replay::{Unreadable, OPEN};

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
    /// The session the replay opened for it, under the id its daemon gave (from the file's
    /// name; the replay's own `s-<n>` for a trace named otherwise): the id the live API gave,
    /// and the one other findings' messages and `consequence_of` name it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
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
    /// As the daemon's API gives it: `critical` pages, `warning` does not (a failure that
    /// followed another's is a warning).
    #[serde(default)]
    pub severity: Option<Severity>,
    /// Where the finding stood when the trace ended: `firing`, or `resolved`.
    #[serde(default)]
    pub state: Option<FindingState>,
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

pub fn analyze(paths: &[PathBuf], cfg: DetectConfig) -> (Report, Vec<Unreadable>) {
    let r = replay::replay(paths, cfg);
    let traces = r.traces.into_iter().map(report).collect();
    let report = Report {
        traces,
        jobs: r.jobs,
    };
    (report, r.errors)
}

fn report(t: Trace) -> TraceReport {
    TraceReport {
        file: t.file,
        session: t.session,
        continued_in: t.continued_in,
        duplicates: t.duplicates,
        job: t.job,
        rank: t.rank,
        host: t.host,
        uid: t.uid,
        gpu: t.gpu,
        unified: t.unified,
        samples: t.samples,
        findings: t.findings.into_iter().map(found).collect(),
        bad_lines: t.bad_lines,
        bad_line_count: t.bad_line_count,
        truncated: t.truncated,
        ended: t.ended,
    }
}

/// The finding as it stands, its forecast as it was raised (the contract's `first_step` +
/// `oom_eta_steps`).
fn found(Found { finding: f, fired }: Found) -> FoundFinding {
    let e = &fired;
    FoundFinding {
        kind: f.kind,
        severity: Some(f.severity),
        state: Some(f.state),
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
