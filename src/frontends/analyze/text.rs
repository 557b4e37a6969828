//! `gpumon analyze`'s text report.

use super::{Report, OPEN};
use crate::core::detect::attribution::{Attribution, Site};
use crate::core::detect::peak::Peak;
use crate::outputs::attribution_text as words;
use crate::outputs::explanation_text;
use crate::units::bytes;

pub fn text(report: &Report) -> String {
    use std::fmt::Write;
    // Job names, messages, paths and reasons come from trainers: each string is escaped for one
    // line before any is laid out (a newline in a function name starts no line of its own).
    let escaped = crate::util::printable::printable_copy(report);
    let report = escaped.as_ref().unwrap_or(report);
    let mut out = String::new();
    for t in &report.traces {
        let _ = write!(out, "{}", t.file);
        // The id messages name it by ("after rank 5's oom (s-…)").
        if let Some(s) = &t.session {
            let _ = write!(out, "  session={s}");
        }
        if let Some(j) = &t.job {
            let _ = write!(out, "  job={j}");
        }
        if let Some(r) = t.rank {
            let _ = write!(out, " rank={r}");
        }
        let _ = writeln!(out, "  {} samples", t.samples);
        if t.unified {
            let _ = writeln!(
                out,
                "  on a unified-memory GPU: judged against its limit from the host's memory, as the daemon noted it"
            );
        }
        for c in &t.continued_in {
            let _ = writeln!(out, "  continued in {c} (the same client after a restart)");
        }
        if t.duplicates > 0 {
            let _ = writeln!(
                out,
                "  {} resent line(s) counted once (in two traces: the client sent them again after the restart)",
                t.duplicates
            );
        }
        if let Some(why) = &t.truncated {
            let _ = writeln!(
                out,
                "  truncated: {why} (the trainer's end is not in this trace)"
            );
        }
        match t.ended.as_deref() {
            Some(OPEN) => {
                let _ = writeln!(out, "  open: a running daemon is still writing this trace");
            }
            Some(how) => {
                let _ = writeln!(
                    out,
                    "  ended: {how} (the daemon stopped while the session was open; the trainer may have gone on in another trace)"
                );
            }
            None => {}
        }
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
                let _ = writeln!(out, "{INDENT}hint: {h}");
            }
            if let Some(a) = &f.attribution {
                attribution_lines(&mut out, a);
            }
            if let Some(p) = &f.peak {
                peak_lines(&mut out, p);
            }
            for l in f
                .explanation
                .iter()
                .flat_map(|x| explanation_text::report(x))
            {
                let _ = writeln!(out, "{INDENT}{l}");
            }
        }
    }
    super::job_text::jobs(&mut out, &report.jobs);
    // A second guard, should a string have escaped the copy: no escape sequence reaches the
    // terminal raw.
    words::printable_lines(&out).into_owned()
}

/// Lines under a finding start below its message.
const INDENT: &str = "                             ";
/// Sites listed under a finding, and callers under each; the JSON has them all.
const TEXT_SITES: usize = 5;
const TEXT_CALLERS: usize = 3;

/// The top sites, largest first: share, bytes, blocks, where, who called it and the trainer's
/// note; or why the trainer could not say.
fn attribution_lines(out: &mut String, a: &Attribution) {
    use std::fmt::Write;
    if let Some(e) = words::error(a) {
        let _ = writeln!(out, "{INDENT}{e}");
        return;
    }
    let within = words::window(a)
        .map(|w| format!(" in {w}"))
        .unwrap_or_default();
    if a.sites.is_empty() {
        let _ = writeln!(out, "{INDENT}attribution: no allocation site grew{within}");
        return;
    }
    let _ = writeln!(
        out,
        "{INDENT}attribution: {} of live memory grew{within}, allocated at",
        bytes(a.total_growth_bytes)
    );
    site_lines(out, &a.sites, |s| a.share(s));
}

/// What was live at the step peak, largest first; or why the trainer could not say.
fn peak_lines(out: &mut String, p: &Peak) {
    use std::fmt::Write;
    if let Some(e) = crate::outputs::peak_text::error(p) {
        let _ = writeln!(out, "{INDENT}{e}");
        return;
    }
    let within = crate::outputs::peak_text::steps(p)
        .map(|w| format!(" in {w}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{INDENT}step peak: {} live{within}, allocated at",
        bytes(p.peak_bytes)
    );
    site_lines(out, &p.sites, |s| p.share(s));
}

/// Sites with their share, bytes, blocks, place, callers and note; the JSON has them all.
fn site_lines(out: &mut String, sites: &[Site], share: impl Fn(&Site) -> f64) {
    use std::fmt::Write;
    for s in sites.iter().take(TEXT_SITES) {
        let _ = writeln!(
            out,
            "{INDENT}  {:>4}  {:>9}  {:>5} blocks  {}",
            words::percent(share(s)),
            bytes(s.bytes),
            s.blocks,
            words::site_path(s)
        );
        let callers = words::callers(s);
        for c in callers.iter().take(TEXT_CALLERS) {
            let _ = writeln!(out, "{INDENT}          called from {}", words::frame(c));
        }
        if callers.len() > TEXT_CALLERS {
            let more = callers.len() - TEXT_CALLERS;
            let _ = writeln!(out, "{INDENT}          \u{2026} {more} more frames");
        }
        if let Some(n) = &s.note {
            let _ = writeln!(out, "{INDENT}          note: {n}");
        }
    }
    if sites.len() > TEXT_SITES {
        let more = sites.len() - TEXT_SITES;
        let _ = writeln!(
            out,
            "{INDENT}  \u{2026} and {more} more sites (--format json lists them all)"
        );
    }
}
