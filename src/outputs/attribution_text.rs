//! An attribution in words, the same wherever a finding is shown (alert annotations,
//! `gpumon analyze`, the TUI): a site as `train.py:27 in kept_outputs`, its share of the
//! window's growth, the window, the stack one frame a line, and a trainer's error answer.

use crate::core::detect::attribution::{Attribution, Frame, Site};
use crate::units::bytes;
use crate::units::thousands;

// Text from a trainer made safe for a terminal: the one rule, kept in util.
pub use crate::util::printable::{printable, printable_lines};

/// "93%"; a share that rounds to 0 was still measured, so "<1%" rather than "0%".
pub fn percent(share: f64) -> String {
    let pct = share * 100.0;
    if pct > 0.0 && pct < 0.5 {
        "<1%".into()
    } else {
        format!("{pct:.0}%")
    }
}

/// The recorded window: "steps 60–180", else its length ("61 s"), else None.
pub fn window(a: &Attribution) -> Option<String> {
    match (a.step_from, a.step_to, a.seconds) {
        (Some(from), Some(to), _) if to > from => Some(format!(
            "steps {}\u{2013}{}",
            thousands(from),
            thousands(to)
        )),
        (_, _, Some(secs)) if secs > 0.0 => Some(format!("{secs:.0} s")),
        _ => None,
    }
}

/// "train.py:27 in kept_outputs": the file's last component, as messages name a site.
pub fn site(s: &Site) -> String {
    named(s.short(), &s.function)
}

/// "/home/alice/proj/train.py:27 in kept_outputs": a site with its whole path.
pub fn site_path(s: &Site) -> String {
    named(format!("{}:{}", s.file, s.line), &s.function)
}

/// "/home/alice/proj/train.py:48 in run": a frame with its whole path, for stacks.
pub fn frame(f: &Frame) -> String {
    named(format!("{}:{}", f.file, f.line), &f.function)
}

/// "train.py:48 in run": a frame as the TUI shows it, short of room.
pub fn frame_short(f: &Frame) -> String {
    let name = f.file.rsplit('/').next().unwrap_or(&f.file);
    named(format!("{name}:{}", f.line), &f.function)
}

fn named(place: String, function: &str) -> String {
    if function.is_empty() {
        place
    } else {
        format!("{place} in {function}")
    }
}

/// "attribution unavailable: torch.cuda is not available", when the trainer could not attribute.
pub fn error(a: &Attribution) -> Option<String> {
    let code = a.error.as_deref()?;
    let mut s = format!("attribution {}", code.replace('_', " "));
    if let Some(d) = a.detail.as_deref().filter(|d| !d.is_empty()) {
        s.push_str(": ");
        s.push_str(d);
    }
    Some(s)
}

/// One line for an alert or a report: the top site and its share, "train.py:27 in kept_outputs
/// (93% of 120.0 MiB in steps 60–180)"; the error answer; or that no site grew.
pub fn summary(a: &Attribution) -> String {
    if let Some(e) = error(a) {
        return e;
    }
    let within = window(a).map(|w| format!(" in {w}")).unwrap_or_default();
    match a.top() {
        Some(top) => format!(
            "{} ({} of {}{within})",
            site(top),
            percent(a.share(top)),
            bytes(a.total_growth_bytes)
        ),
        None => format!("no allocation site grew{within}"),
    }
}

/// The frames that called the site, innermost first: what its stack holds past the site's own
/// frame (the whole stack when the site's frame is not in it).
pub fn callers(s: &Site) -> &[Frame] {
    let own = s
        .stack
        .iter()
        .position(|f| f.file == s.file && f.line == s.line);
    match own {
        Some(i) => &s.stack[i + 1..],
        None => &s.stack,
    }
}

/// The site and its callers, one frame a line with whole paths, at most `max` lines (the last
/// saying how many more there were).
pub fn stack(s: &Site, max: usize) -> Vec<String> {
    let own = Frame {
        file: s.file.clone(),
        line: s.line,
        function: s.function.clone(),
    };
    let all: Vec<String> = std::iter::once(&own).chain(callers(s)).map(frame).collect();
    if all.len() <= max {
        return all;
    }
    let keep = max.saturating_sub(1);
    let mut out: Vec<String> = all[..keep].to_vec();
    out.push(format!("\u{2026} {} more frames", all.len() - keep));
    out
}

#[cfg(test)]
mod tests;
