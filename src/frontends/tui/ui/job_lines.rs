//! A job as the trainer table heads its ranks: its name, ranks and state; for a failed job the
//! verdict (the first failure, what followed it); its memory across ranks; its findings and
//! what did not add up. Each line fits the width it is given, cut with "…".

use std::collections::BTreeMap;

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use super::fmt::{clip, clip_keeping_last, duration};
use super::theme::Theme;
use crate::core::detect::Kind;
use crate::core::jobs::text::{failure_refs, LATER};
use crate::core::jobs::verdict::{ranks_text, summary};
use crate::core::jobs::view::{who, FailureRef, JobMemory};
use crate::core::jobs::{JobState, JobView};
use crate::frontends::tui::app::jobs::Job;
use crate::units::{bytes, duration_coarse};
use crate::util::printable::printable;

/// Conflicts listed one a line before the rest are counted.
const CONFLICTS_SHOWN: usize = 2;
/// Later failures named before the rest are counted.
const LATER_SHOWN: usize = 3;

/// The lines heading `job`'s ranks, each at most `width` cells.
pub fn lines(job: &Job, width: usize, now: f64, t: Theme) -> Vec<Line<'static>> {
    let v = &job.view;
    let mut out = vec![head(job, t)];
    if matches!(v.state, JobState::Failed | JobState::Stopped) {
        out.extend(failure(v, now, t));
    }
    if let Some(l) = memory(v, width, t) {
        out.push(l);
    }
    let failed = failed_ranks(v);
    for f in &v.findings {
        // An OOM or crash of the ranks the verdict names is told there already.
        if matches!(f.kind, Kind::Oom | Kind::Crash | Kind::Stopped)
            && !f.ranks.is_empty()
            && f.ranks.iter().all(|r| failed.contains(r))
        {
            continue;
        }
        let style = if f.kind == Kind::Oom {
            t.crit()
        } else {
            t.warn()
        };
        // The last clause (how long the run has) outlives a cut, as in the Findings list.
        let message = clip_keeping_last(&printable(&f.message), width.saturating_sub(4));
        out.push(Line::from(vec![
            Span::raw("  "),
            Span::styled(format!("▲ {message}"), style),
        ]));
    }
    for c in v.conflicts.iter().take(CONFLICTS_SHOWN) {
        out.push(Line::from(vec![
            Span::raw("  "),
            Span::styled("conflict: ", t.warn()),
            Span::raw(printable(c).into_owned()),
        ]));
    }
    if v.conflicts.len() > CONFLICTS_SHOWN {
        let n = v.conflicts.len() - CONFLICTS_SHOWN;
        out.push(Line::styled(
            format!("  and {n} more conflict{}", if n == 1 { "" } else { "s" }),
            t.warn(),
        ));
    }
    out.into_iter().map(|l| fit(l, width, t)).collect()
}

/// "■ llama (run 42) · 8/8 ranks on node-a, node-b · failed"
fn head(job: &Job, t: Theme) -> Line<'static> {
    let v = &job.view;
    let seen = v.ranks.len() as u64;
    let mut ranks = match v.world_size {
        Some(n) => format!("{seen}/{n} ranks"),
        // Processes that sent no rank are no "job of 0 ranks": say what they are.
        None if seen == 0 && v.members.len() <= 1 => "one process, no rank".to_string(),
        None if seen == 0 => format!("{} processes, no ranks", v.members.len()),
        None => format!("{seen} ranks"),
    };
    if v.state == JobState::Running && (job.live as u64) < seen {
        ranks.push_str(&format!(" ({} live)", job.live));
    }
    if v.hosts.len() > 1 {
        ranks.push_str(&format!(" on {}", v.hosts.join(", ")));
    }
    let state = match v.state {
        JobState::Failed => t.crit(),
        JobState::Running => t.ok(),
        _ => t.dim(),
    };
    let mut s = vec![
        Span::styled(format!("■ {}", printable(&v.name())), t.bold()),
        Span::raw(format!(" · {} · ", printable(&ranks))),
        Span::styled(v.state.as_str(), state),
    ];
    if v.restarts > 0 {
        s.push(Span::raw(format!(" · restarted {}×", v.restarts)));
    }
    Line::from(s)
}

/// The verdict, what the first failure said, and the ranks that went down after it.
fn failure(v: &JobView, now: f64, t: Theme) -> Vec<Line<'static>> {
    // A stop is an end someone chose: told, not alarmed.
    let (mark, style) = match v.state {
        JobState::Stopped => ("■", t.warn()),
        _ => ("✗", t.crit()),
    };
    let mut out = vec![Line::from(vec![
        Span::raw("  "),
        Span::styled(format!("{mark} {}", printable(&summary(v))), style),
    ])];
    if let Some(f) = v.first_failure.as_ref().or(v.stop.as_ref()) {
        // When, then what the rank said (the trainer's words, which a narrow table cuts).
        let mut what = format!("{} ago", duration((now - f.ts).max(0.0)));
        if !f.message.is_empty() {
            what.push_str(": ");
            what.push_str(&printable(&f.message));
        }
        out.push(Line::styled(format!("    {what}"), t.dim()));
    }
    // What was firing when it failed: the leak behind the OOM, told after the ranks are gone.
    for f in &v.findings_at_failure {
        out.push(Line::from(vec![
            Span::raw("  "),
            Span::styled("▲ before it: ", t.warn()),
            Span::raw(printable(&f.message).into_owned()),
        ]));
    }
    if !v.consequences.is_empty() {
        out.push(Line::from(vec![
            Span::raw("  "),
            Span::styled("↳ followed: ", t.warn()),
            Span::raw(printable(&refs(&v.consequences)).into_owned()),
        ]));
    }
    if !v.other_failures.is_empty() {
        let named = failure_refs(&v.other_failures, LATER_SHOWN);
        out.push(Line::from(vec![
            Span::raw("  "),
            Span::styled(format!("{LATER}: "), t.warn()),
            Span::raw(printable(&named).into_owned()),
        ]));
    }
    if let Some(p) = &v.previous_failure {
        let mut s = format!("previous attempt: {} {}", who(p.rank, &p.session), p.kind);
        if let Some(h) = &p.host {
            s.push_str(&format!(" on {h}"));
        }
        out.push(Line::styled(format!("  {}", printable(&s)), t.dim()));
    }
    out
}

/// "7 ranks (0-4,6,7) crashed within 1.5 s", the kinds said where they differ.
fn refs(f: &[FailureRef]) -> String {
    let mut ranks: Vec<u64> = f.iter().filter_map(|r| r.rank).collect();
    ranks.sort_unstable();
    let unranked = f.len() - ranks.len();
    let within = f.iter().map(|r| r.after_seconds).fold(0.0_f64, f64::max);
    let verb = if f.iter().all(|r| r.kind == Kind::Crash) {
        "crashed".to_string()
    } else if f.iter().all(|r| r.kind == Kind::Stopped) {
        "stopped".to_string()
    } else {
        let mut kinds: Vec<&str> = f.iter().map(|r| r.kind.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        format!("failed ({})", kinds.join(", "))
    };
    let mut who = match ranks.len() {
        0 => String::new(),
        1 => format!("rank {}", ranks[0]),
        n => format!("{n} ranks ({})", ranks_text(&ranks)),
    };
    if unranked > 0 {
        if !who.is_empty() {
            who.push_str(" and ");
        }
        who.push_str(&format!(
            "{unranked} session{}",
            if unranked == 1 { "" } else { "s" }
        ));
    }
    format!("{who} {verb} within {within:.1} s")
}

/// Ranks whose failure the verdict names.
fn failed_ranks(v: &JobView) -> Vec<u64> {
    let first = v.first_failure.iter().chain(&v.stop).filter_map(|f| f.rank);
    let rest = v
        .consequences
        .iter()
        .chain(&v.other_failures)
        .filter_map(|f| f.rank);
    first.chain(rest).collect()
}

/// "OOM in ~14m (rank 3) · peaks 30.0–37.0 GiB, top rank 7 (median 33.0 GiB) · headroom
/// 1.2 GiB (rank 3) · stray: ranks 1-7 on GPU 0 (3.5 GiB)": what the job dies of first comes
/// first, and a part that does not fit in `width` is left out whole rather than cut.
fn memory(v: &JobView, width: usize, t: Theme) -> Option<Line<'static>> {
    let m = &v.memory;
    // (text, style, whether " · " goes before it)
    let mut parts: Vec<(String, Style, bool)> = Vec::new();
    if let Some(eta) = v.oom_eta_seconds {
        let r = rank_of(m.oom_eta_rank);
        parts.push((
            format!("OOM in ~{}{r}", duration_coarse(eta)),
            t.crit(),
            true,
        ));
    }
    if let Some((p, median)) = peaks(m) {
        parts.push((p, t.text(), true));
        parts.extend(median.map(|m| (m, t.text(), false)));
    }
    if let Some(h) = m.headroom_bytes {
        let r = rank_of(m.headroom_rank);
        let s = if h < 0 {
            format!("{} over the limit{r}", bytes(h.unsigned_abs()))
        } else {
            format!("headroom {}{r}", bytes(h as u64))
        };
        parts.push((s, t.text(), true));
    }
    if let Some(s) = stray(m) {
        parts.push((s, t.warn(), true));
    }
    let mut spans = vec![Span::raw("  ")];
    let mut left = width.saturating_sub(2);
    let mut shown = 0;
    for (s, style, sep) in parts {
        let sep = if sep && shown > 0 { " · " } else { "" };
        let need = sep.chars().count() + s.chars().count();
        // The first part is shown whatever the room (cut, then); a part after it only whole.
        if shown > 0 && need > left {
            continue;
        }
        left = left.saturating_sub(need);
        if !sep.is_empty() {
            spans.push(Span::styled(sep, t.dim()));
        }
        spans.push(Span::styled(s, style));
        shown += 1;
    }
    (shown > 0).then(|| Line::from(spans))
}

/// " (rank 3)", or nothing where the member sent no rank.
fn rank_of(r: Option<u64>) -> String {
    r.map(|r| format!(" (rank {r})")).unwrap_or_default()
}

/// ("peaks 30.0 GiB–37.0 GiB, top rank 7", " (median 33.0 GiB)"), or ("peaks 30.0 GiB",
/// None) where every rank peaks alike.
fn peaks(m: &JobMemory) -> Option<(String, Option<String>)> {
    let hi = m.peak_max_bytes?;
    let lo = m.peak_min_bytes.unwrap_or(hi);
    if m.spread_bytes.unwrap_or(0) == 0 {
        return Some((format!("peaks {}", bytes(hi)), None));
    }
    let mut s = format!("peaks {}–{}", bytes(lo), bytes(hi));
    if let Some(r) = m.peak_max_rank {
        s.push_str(&format!(", top rank {r}"));
    }
    let median = m
        .peak_median_bytes
        .map(|m| format!(" (median {})", bytes(m)));
    Some((s, median))
}

/// Stray contexts by GPU: "stray: ranks 1-7 on GPU 0 (3.5 GiB)".
fn stray(m: &JobMemory) -> Option<String> {
    if m.stray.is_empty() {
        return None;
    }
    let mut by_gpu: BTreeMap<String, (Vec<u64>, u64)> = BTreeMap::new();
    for s in &m.stray {
        let gpu = match s.stray.gpu {
            Some(g) => format!("GPU {g}"),
            None => clip(&s.stray.gpu_uuid, 16),
        };
        let e = by_gpu.entry(gpu).or_default();
        e.0.extend(s.rank);
        e.1 += s.stray.bytes;
    }
    let parts: Vec<String> = by_gpu
        .into_iter()
        .map(|(gpu, (mut ranks, b))| {
            ranks.sort_unstable();
            ranks.dedup();
            let who = match ranks.len() {
                0 => "sessions".to_string(),
                1 => format!("rank {}", ranks[0]),
                _ => format!("ranks {}", ranks_text(&ranks)),
            };
            format!("{who} on {gpu} ({})", bytes(b))
        })
        .collect();
    Some(format!("stray: {}", printable(&parts.join(", "))))
}

/// `line` cut to `width` cells, the cut marked "…".
fn fit(line: Line<'static>, width: usize, t: Theme) -> Line<'static> {
    if line.width() <= width {
        return line;
    }
    let mut left = width.saturating_sub(1);
    let mut spans = Vec::new();
    for s in line.spans {
        let w = s.width();
        if w <= left {
            left -= w;
            spans.push(s);
            continue;
        }
        let mut cut = String::new();
        for c in s.content.chars() {
            let mut buf = [0; 4];
            let w = Span::raw(&*c.encode_utf8(&mut buf)).width();
            if w > left {
                break;
            }
            left -= w;
            cut.push(c);
        }
        spans.push(Span::styled(cut, s.style));
        break;
    }
    spans.push(Span::styled("…", t.dim()));
    Line::from(spans)
}

#[cfg(test)]
mod tests;
