//! Recorded traces as a source (`gpumon analyze`): read as the daemon reads its socket (the
//! same framing, parsing and connection rules) into the same `Core`, with a clock taken from
//! the lines' timestamps. The traces of one record directory were one daemon's sessions and
//! are replayed together into one core, interleaved by time (node.rs); several directories
//! are several nodes, each replayed into its own core, and their jobs joined by the merge the
//! TUI uses across daemons (`core::jobs::merge`). What comes out is the cores' own answer: each
//! trace's findings as the daemon's API gives them, and the jobs' views.

mod cursor;
mod expand;
mod framing;
mod ids;
mod node;
mod open;
mod stitch;

use std::path::PathBuf;

use crate::core::detect::{DetectConfig, Evidence, Finding};
use crate::core::jobs::verdict::Rules;
use crate::core::jobs::JobView;

/// `ended` of a trace that a running daemon still writes (it holds a lock on the file).
pub const OPEN: &str = "open";

/// A trace that could not be read at all.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct Unreadable {
    pub file: String,
    pub reason: String,
}

/// One run of traces (a trace and those that continue it) as its session was replayed.
#[derive(Debug)]
pub struct Trace {
    pub file: String,
    /// Traces that continue this one, in order (stitch.rs).
    pub continued_in: Vec<String>,
    /// Lines a later trace of the run held again (resent, the same `seq`): taken once.
    pub duplicates: u64,
    /// The session the replay's core opened for it.
    pub session: Option<String>,
    pub job: Option<String>,
    pub rank: Option<u64>,
    /// The host the daemon recorded on (`trace_host`).
    pub host: Option<String>,
    /// The uid the daemon read off the socket (`trace_peer`).
    pub uid: Option<u32>,
    /// The GPU index the daemon resolved the trainer's device to (`trace_gpu`).
    pub gpu: Option<u32>,
    /// The trainer's GPU was a unified-memory device (`trace_unified`).
    pub unified: bool,
    pub samples: u64,
    /// Every finding of its session that fired, in the order they first fired.
    pub findings: Vec<Found>,
    /// Rejected lines, as `line N: message (code)` (the first few).
    pub bad_lines: Vec<String>,
    pub bad_line_count: u64,
    /// The trace stops short of the session's end (its reason): no crash is read into it.
    pub truncated: Option<String>,
    /// The daemon ended the trace while the session was open, or still writes it (`OPEN`).
    pub ended: Option<String>,
}

impl Trace {
    fn new(file: String) -> Self {
        Self {
            file,
            continued_in: Vec::new(),
            duplicates: 0,
            session: None,
            job: None,
            rank: None,
            host: None,
            uid: None,
            gpu: None,
            unified: false,
            samples: 0,
            findings: Vec::new(),
            bad_lines: Vec::new(),
            bad_line_count: 0,
            truncated: None,
            ended: None,
        }
    }
}

/// A finding as the core holds it at the end of the replay (state, severity, message, hint,
/// consequence_of, evidence), with the evidence it first fired with: the forecast analyze's
/// contract reports is the one made when the finding was raised.
#[derive(Debug)]
pub struct Found {
    pub finding: Finding,
    pub fired: Evidence,
}

/// Every node's traces and the jobs across them.
pub struct Replayed {
    pub traces: Vec<Trace>,
    pub jobs: Vec<JobView>,
    pub errors: Vec<Unreadable>,
}

/// Replays `paths` (trace files and record directories), grouped by node (expand.rs).
pub fn replay(paths: &[PathBuf], cfg: DetectConfig) -> Replayed {
    let mut errors = Vec::new();
    let nodes = expand::nodes(paths, &mut errors);
    let several = nodes.len() > 1;
    let mut traces = Vec::new();
    let mut jobs = Vec::new();
    for files in nodes {
        let n = node::replay(files, cfg, &mut errors);
        traces.extend(n.traces);
        jobs.extend(n.jobs);
    }
    if several {
        jobs = crate::core::jobs::merge(jobs, &[], &Rules::of(&cfg));
    }
    Replayed {
        traces,
        jobs,
        errors,
    }
}
