//! Where a leak's memory is allocated, in the trainer detail: the sites the trainer reported,
//! largest first (share of the growth, bytes, file:line and function), with who called each and
//! the trainer's note when there is room; or why the trainer could not say. What was live at a
//! near_limit's step peak is listed the same way.

use ratatui::text::{Line, Span};

use super::fmt::{self, ago, plural, thousands};
use super::theme::Theme;
use crate::core::detect::attribution::{Attribution, Site};
use crate::core::detect::peak::Peak;
use crate::core::model::Timestamp;
use crate::core::trainer::{EventKind, EventRecord};
use crate::outputs::attribution_text as words;
use crate::outputs::peak_text;
use crate::units::bytes;

/// How much of an attribution fits.
#[derive(Debug, Clone, Copy)]
pub struct Room {
    /// Sites listed, at most.
    pub sites: usize,
    /// Callers listed under each site, at most; notes are shown only where callers are.
    pub callers: usize,
    /// Columns available, for wrapping notes.
    pub width: u16,
}

/// Columns before a site's place (" 100%  120.0 MiB  "): callers and notes line up under it.
/// The share is right-aligned in 5 so a number never runs on from text beside it.
const INDENT: usize = 18;

pub fn lines(a: &Attribution, room: Room, t: Theme) -> Vec<Line<'static>> {
    if let Some(e) = words::error(a) {
        return vec![Line::styled(e, t.warn())];
    }
    let within = words::window(a)
        .map(|w| format!(" in {w}"))
        .unwrap_or_default();
    if a.sites.is_empty() {
        return vec![Line::styled(
            format!("No allocation site grew{within}."),
            t.dim(),
        )];
    }
    let mut out = vec![Line::from(vec![
        Span::styled("Allocated at", t.bold()),
        Span::styled(
            format!(" · {} grew{within}", bytes(a.total_growth_bytes)),
            t.dim(),
        ),
    ])];
    for s in a.sites.iter().take(room.sites) {
        out.extend(site(s, a.share(s), room, t));
    }
    if a.sites.len() > room.sites {
        out.push(more(a.sites.len() - room.sites, t));
    }
    out
}

/// What was live at a near_limit's step peak, by site, as an armed trainer reported it: the
/// activations to shrink to fit; or why the trainer could not say.
pub fn peak(p: &Peak, room: Room, t: Theme) -> Vec<Line<'static>> {
    if let Some(e) = peak_text::error(p) {
        return vec![Line::styled(e, t.warn())];
    }
    let within = peak_text::steps(p)
        .map(|w| format!(" in {w}"))
        .unwrap_or_default();
    if p.sites.is_empty() {
        return vec![Line::styled(
            format!("No allocation site of the trainer's code at the step peak{within}."),
            t.dim(),
        )];
    }
    let mut out = vec![Line::from(vec![
        Span::styled("Live at the step peak", t.bold()),
        Span::styled(format!(" · {}{within}", bytes(p.peak_bytes)), t.dim()),
    ])];
    for s in p.sites.iter().take(room.sites) {
        out.extend(site(s, p.share(s), room, t));
    }
    if p.sites.len() > room.sites {
        out.push(more(p.sites.len() - room.sites, t));
    }
    out
}

/// One site: its share, bytes, place and function (and blocks where callers fit), then who
/// called it and the trainer's note when there is room. Shared with an OOM's live sites.
pub fn site(s: &Site, share: f64, room: Room, t: Theme) -> Vec<Line<'static>> {
    let mut l = vec![
        Span::styled(format!("{:>5}", words::percent(share)), t.warn()),
        Span::raw(format!("  {:>9}  ", bytes(s.bytes))),
        Span::styled(s.short(), t.accent()),
    ];
    if !s.function.is_empty() {
        l.push(Span::raw(format!(" {}", s.function)));
    }
    if room.callers > 0 {
        l.push(Span::styled(
            format!(" · {} blocks", thousands(s.blocks)),
            t.dim(),
        ));
    }
    let mut out = vec![Line::from(l)];
    if room.callers == 0 {
        return out;
    }
    let pad = " ".repeat(INDENT);
    for c in words::callers(s).iter().take(room.callers) {
        out.push(Line::styled(
            format!("{pad}← {}", words::frame_short(c)),
            t.dim(),
        ));
    }
    if let Some(n) = &s.note {
        let w = usize::from(room.width).saturating_sub(INDENT).max(20);
        for part in wrap(n, w) {
            out.push(Line::from(vec![Span::raw(pad.clone()), Span::raw(part)]));
        }
    }
    out
}

/// "… 2 more sites", under the sites listed.
pub fn more(n: usize, t: Theme) -> Line<'static> {
    Line::styled(
        format!("{}… {}", " ".repeat(INDENT), plural(n as u64, "more site")),
        t.dim(),
    )
}

/// "Asking the trainer…" while the session's latest attribution event is a request: the daemon
/// asked and the trainer is recording its window (or has not answered yet).
pub fn asking(events: &[EventRecord], now: Timestamp, t: Theme) -> Option<Line<'static>> {
    let last = events.iter().rev().find(|e| {
        matches!(
            e.kind,
            EventKind::AttributionRequested | EventKind::Attribution | EventKind::AttributionFailed
        )
    })?;
    (last.kind == EventKind::AttributionRequested).then(|| {
        Line::styled(
            format!(
                "Asking the trainer where the growth is allocated\u{2026} (asked {})",
                ago(now, last.ts)
            ),
            t.dim(),
        )
    })
}

/// Words of `text` in lines of at most `width` columns (a longer word gets a line of its own).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for w in text.split_whitespace() {
        if !cur.is_empty() && fmt::width(&cur) + 1 + fmt::width(w) > width {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests;
