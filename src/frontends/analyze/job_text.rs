//! The jobs part of `gpumon analyze`'s text report: each job of more than one trace, or that
//! failed, with its first failure (rank, kind, host, step, file) and the ranks that followed.

use std::fmt::Write;

use crate::core::jobs::verdict::ranks_text;
use crate::core::jobs::view::who;
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
            j.state.as_str()
        );
        let head = match (&j.first_failure, &j.stop) {
            (Some(f), _) => Some(("first failure", f)),
            (None, Some(f)) => Some(("stopped first", f)),
            (None, None) => None,
        };
        if let Some((what, f)) = head {
            let host = f
                .host
                .as_deref()
                .map(|h| format!(" on {h}"))
                .unwrap_or_default();
            let step = f.step.map(|s| format!(" at step {s}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "  {what}: {} {}{host}{step}",
                who(f.rank, &f.session),
                f.kind
            );
            if let Some(file) = &f.file {
                let _ = writeln!(out, "    {file}");
            }
            let _ = writeln!(out, "    {}", f.message);
            if !f.order_unknown.is_empty() {
                let _ = writeln!(
                    out,
                    "    order unknown against ranks {} (other hosts, within the clocks' tolerance)",
                    ranks_text(&f.order_unknown)
                );
            }
        }
        for f in &j.findings_at_failure {
            let _ = writeln!(out, "  before it: {}", f.message);
        }
        for c in &j.consequences {
            let host = c
                .host
                .as_deref()
                .map(|h| format!(" on {h}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  followed: {} {} +{:.1} s{host}  {}",
                who(c.rank, &c.session),
                c.kind,
                c.after_seconds,
                c.file.as_deref().unwrap_or("")
            );
        }
        for c in &j.other_failures {
            let _ = writeln!(
                out,
                "  also failed (past the cascade window): {} {} +{:.0} s",
                who(c.rank, &c.session),
                c.kind,
                c.after_seconds
            );
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

#[cfg(test)]
mod tests;
