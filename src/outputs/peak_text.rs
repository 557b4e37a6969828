//! A step peak in words, for every output that shows one (alerts, `gpumon analyze`, the TUI):
//! composed from the fields, with the attribution's wording for sites and shares.

use super::attribution_text::{percent, site};
use crate::core::detect::peak::Peak;
use crate::units::{bytes, thousands};

/// The recorded steps: "steps 1,210–1,230", when the trainer said.
pub fn steps(p: &Peak) -> Option<String> {
    match (p.step_from, p.step_to) {
        (Some(from), Some(to)) if to > from => Some(format!(
            "steps {}\u{2013}{}",
            thousands(from),
            thousands(to)
        )),
        _ => None,
    }
}

/// "step peak failed: snapshot raised", when the trainer could not say.
pub fn error(p: &Peak) -> Option<String> {
    let code = p.error.as_deref()?;
    let mut s = format!("step peak {}", code.replace('_', " "));
    if let Some(d) = p.detail.as_deref().filter(|d| !d.is_empty()) {
        s.push_str(": ");
        s.push_str(d);
    }
    Some(s)
}

/// One line for an alert or a report: "model.py:88 in attention (50% of the 4.0 GiB peak in
/// steps 1,210–1,230)"; the error answer; or that no site of the trainer's code held memory.
pub fn summary(p: &Peak) -> String {
    if let Some(e) = error(p) {
        return e;
    }
    let within = steps(p).map(|w| format!(" in {w}")).unwrap_or_default();
    match p.top() {
        Some(top) => format!(
            "{} ({} of the {} peak{within})",
            site(top),
            percent(p.share(top)),
            bytes(p.peak_bytes)
        ),
        None => format!(
            "no allocation site in the trainer's code at the {} peak{within}",
            bytes(p.peak_bytes)
        ),
    }
}

#[cfg(test)]
mod tests;
