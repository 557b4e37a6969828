//! `gpumon status`'s jobs: each run of several ranks as one (docs/jobs.md), in the API's order
//! (running first): its state, how many of its ranks this daemon sees, the verdict, the spread
//! of the ranks' memory, and the job's findings and conflicts. A job of one rank is its trainer,
//! which the trainer table already shows. Strings come escaped: `table` escapes the snapshot
//! before it is laid out.

use std::fmt::Write as _;

use super::truncate;
use crate::core::jobs::text::{failure_refs, later_failures};
use crate::core::jobs::verdict::{ranks_text, summary};
use crate::core::jobs::view::{who, JobView};
use crate::core::snapshot::Snapshot;
use crate::units::{bytes, duration_coarse};

/// Followers named one by one on the `followed` line; the rest are counted.
const FOLLOWERS_NAMED: usize = 8;
/// The longest detail line, as the trainer table cuts finding messages.
const LINE: usize = 160;

/// Whether the section lists `v`: a run of more than one rank.
pub fn listed(v: &JobView) -> bool {
    v.world_size.unwrap_or(0).max(v.ranks.len() as u64) > 1
}

/// The section, when a job is listed: a row per job, then its detail lines.
pub fn section(snap: &Snapshot, out: &mut String) {
    let jobs: Vec<&JobView> = snap.jobs.iter().filter(|v| listed(v)).collect();
    if jobs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n{:<36} {:>6} {:<8} {:>7}  VERDICT",
        "JOB", "UID", "STATE", "RANKS"
    );
    for v in jobs {
        let world = v.world_size.map_or("?".into(), |w| w.to_string());
        let verdict = match (&v.first_failure, &v.previous_failure) {
            (Some(_), _) => summary(v),
            (None, _) if v.stop.is_some() => summary(v),
            (None, Some(p)) => format!(
                "restarted {} times; before: {} {}",
                v.restarts,
                who(p.rank, &p.session),
                p.kind
            ),
            (None, None) => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<36} {:>6} {:<8} {:>7}  {verdict}",
            truncate(&v.run_name(), 36),
            // Whose job: two users' runs of one name and run id are two rows.
            v.uid.map_or("?".into(), |u| u.to_string()),
            v.state.as_str(),
            format!("{}/{world}", v.ranks.len()),
        );
        for line in details(v) {
            let _ = writeln!(out, "  {}", truncate(&line, LINE));
        }
    }
}

/// The lines under a job's row: the first failure's message, who followed, the memory, the
/// findings and what did not add up.
fn details(v: &JobView) -> Vec<String> {
    let mut lines = Vec::new();
    let head = v.first_failure.as_ref().or(v.stop.as_ref());
    if let Some(f) = head.filter(|f| !f.message.is_empty()) {
        let who = who(f.rank, &f.session);
        lines.push(format!("{who} {}: {}", f.kind, f.message));
    }
    for f in &v.findings_at_failure {
        lines.push(format!("before it: {}", f.message));
    }
    if !v.consequences.is_empty() {
        let followed = failure_refs(&v.consequences, FOLLOWERS_NAMED);
        lines.push(format!("followed: {followed}"));
    }
    lines.extend(later_failures(&v.other_failures, FOLLOWERS_NAMED));
    if let Some(m) = memory(v) {
        lines.push(m);
    }
    for f in &v.findings {
        lines.push(f.message.clone());
    }
    for c in &v.conflicts {
        lines.push(format!("conflict: {c}"));
    }
    lines
}

/// `memory: peaks 3.5 GiB-4.5 GiB (highest rank 2), headroom 11.2 GiB (rank 2), OOM in 12m
/// (rank 2)`: None when nothing is known.
fn memory(v: &JobView) -> Option<String> {
    let m = &v.memory;
    let rank = |r: Option<u64>| r.map_or(String::new(), |r| format!(" (rank {r})"));
    let mut parts = Vec::new();
    if let (Some(lo), Some(hi)) = (m.peak_min_bytes, m.peak_max_bytes) {
        let top = m
            .peak_max_rank
            .map_or(String::new(), |r| format!(" (highest rank {r})"));
        parts.push(format!("peaks {}-{}{top}", bytes(lo), bytes(hi)));
    }
    if let Some(h) = m.headroom_bytes {
        let sign = if h < 0 { "-" } else { "" };
        let text = format!("{sign}{}", bytes(h.unsigned_abs()));
        parts.push(format!("headroom {text}{}", rank(m.headroom_rank)));
    }
    if let Some(eta) = v.oom_eta_seconds {
        let when = duration_coarse(eta);
        parts.push(format!("OOM in ~{when}{}", rank(m.oom_eta_rank)));
    }
    if !m.stray.is_empty() {
        let mut ranks: Vec<u64> = m.stray.iter().filter_map(|s| s.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        parts.push(format!(
            "memory on another GPU: ranks {}",
            ranks_text(&ranks)
        ));
    }
    (!parts.is_empty()).then(|| format!("memory: {}", parts.join(", ")))
}
