//! An OOM explanation in words, the same wherever a finding is shown (alert annotations,
//! `gpumon analyze`): the line that asked with its callers, the largest live sites with their
//! share of live memory, the trainer's reasons and remedies.

use super::attribution_text::{frame, percent, site_path};
use crate::core::detect::explanation::Explanation;
use crate::units::bytes;

/// "/home/alice/proj/oomlib.py:37 in dev_big": the line that asked, when the trainer knew it.
pub fn failing(x: &Explanation) -> Option<String> {
    let f = x.failing_site.as_ref()?;
    Some(frame(&crate::core::detect::attribution::Frame {
        file: f.file.clone(),
        line: f.line,
        function: f.function.clone(),
    }))
}

/// "/home/alice/proj/oomlib.py:32 in dev_pin: 1.2 GiB, 95% of live memory": the largest live
/// site, when the trainer's history named any.
pub fn top_live(x: &Explanation) -> Option<String> {
    let top = x.top_live()?;
    Some(format!(
        "{}: {}, {} of live memory",
        site_path(top),
        bytes(top.bytes),
        percent(x.live_share(top))
    ))
}

/// Why the lines are unknown, when they are.
pub fn lines_unknown(x: &Explanation) -> Option<&'static str> {
    match (x.history, &x.failing_site) {
        (false, _) => Some("the lines are unknown: allocation history was not recording"),
        (true, None) => {
            Some("the line that asked is unknown: no Python frame (raised inside backward, say)")
        }
        (true, Some(_)) => None,
    }
}

/// Live sites listed, and callers under the failing line, in a report; the JSON has them all.
const SITES: usize = 5;
const CALLERS: usize = 3;

/// The explanation as report lines: pattern, the failing line and its callers, the reasons,
/// what was live, the remedies. Each line is plain text; the caller escapes for a terminal.
pub fn report(x: &Explanation) -> Vec<String> {
    let mut out = vec![format!("explanation: {}", x.pattern)];
    if let Some(f) = failing(x) {
        out.push(format!("failed at {f}"));
        let callers = x.failing_site.iter().flat_map(|s| {
            let own = s
                .stack
                .iter()
                .position(|c| c.file == s.file && c.line == s.line);
            s.stack.iter().skip(own.map_or(0, |i| i + 1))
        });
        for c in callers.take(CALLERS) {
            out.push(format!("  called from {}", frame(c)));
        }
    }
    if let Some(why) = lines_unknown(x) {
        out.push(why.to_string());
    }
    for r in &x.reasons {
        out.push(format!("reason: {r}"));
    }
    if !x.live_sites.is_empty() {
        out.push("live at the OOM:".into());
        for s in x.live_sites.iter().take(SITES) {
            out.push(format!(
                "  {:>4}  {:>9}  {:>5} blocks  {}",
                percent(x.live_share(s)),
                bytes(s.bytes),
                s.blocks,
                site_path(s)
            ));
        }
        if x.live_sites.len() > SITES {
            let more = x.live_sites.len() - SITES;
            out.push(format!(
                "  \u{2026} and {more} more sites (--format json lists them all)"
            ));
        }
    }
    for r in &x.remedies {
        out.push(format!("remedy: {r}"));
    }
    out
}

#[cfg(test)]
mod tests;
