//! The jobs part of `gpumon analyze`'s text report: each job of more than one trace, or that
//! failed, with the core's verdict (crates/core/src/core/jobs: `verdict::summary`, and `text`
//! for the failures after the first), as `gpumon status` and the TUI word it, plus what only
//! the traces give: the file of each failure.

use std::fmt::Write;

use crate::core::jobs::text::{failure_ref, later_failures};
use crate::core::jobs::verdict::{ranks_text, summary};
use crate::core::jobs::view::FailureRef;
use crate::core::jobs::JobView;
use crate::units::bytes;

pub fn jobs(out: &mut String, jobs: &[JobView]) {
    for j in jobs
        .iter()
        .filter(|j| j.members.len() > 1 || j.first_failure.is_some() || j.stop.is_some())
    {
        let hosts = if j.hosts.is_empty() {
            String::new()
        } else {
            format!(" on {}", j.hosts.join(", "))
        };
        // A trace without a rank is named by its session below, never as an empty "ranks ".
        let ranks = match j.ranks.as_slice() {
            [] => "no rank".to_string(),
            [r] => format!("rank {r}"),
            rs => format!("ranks {}", ranks_text(rs)),
        };
        let traces = match j.members.len() {
            1 => "1 trace".to_string(),
            n => format!("{n} traces"),
        };
        let _ = writeln!(
            out,
            "job {}: {traces}, {ranks}{hosts}: {}",
            j.name(),
            summary(j)
        );
        if let Some(f) = j.first_failure.as_ref().or(j.stop.as_ref()) {
            if let Some(file) = &f.file {
                let _ = writeln!(out, "  {file}");
            }
            let _ = writeln!(out, "  {}", f.message);
        }
        for f in &j.findings_at_failure {
            let _ = writeln!(out, "  before it: {}", f.message);
        }
        for c in &j.consequences {
            let _ = writeln!(out, "  followed: {}", with_place(c));
        }
        // Every one named: the report is the whole story, not a screen's line.
        if let Some(later) = later_failures(&j.other_failures, j.other_failures.len()) {
            let _ = writeln!(out, "  {later}");
        }
        for f in &j.findings {
            let _ = writeln!(out, "  {}", f.message);
        }
        let m = &j.memory;
        if let (Some(lo), Some(hi)) = (m.peak_min_bytes, m.peak_max_bytes) {
            let top = m
                .peak_max_rank
                .map(|r| format!(" (rank {r})"))
                .unwrap_or_default();
            let _ = writeln!(out, "  step peaks {} to {}{top}", bytes(lo), bytes(hi));
        }
        for c in &j.conflicts {
            let _ = writeln!(out, "  conflict: {c}");
        }
    }
}

/// `rank 0 crash +0.5 s on node-a  /records/node-a/....trace.jsonl`: the core's words for a
/// failure, then where it was read.
fn with_place(c: &FailureRef) -> String {
    let host = c
        .host
        .as_deref()
        .map(|h| format!(" on {h}"))
        .unwrap_or_default();
    let file = c.file.as_deref().unwrap_or("");
    format!("{}{host}  {file}", failure_ref(c))
}

#[cfg(test)]
mod tests;
