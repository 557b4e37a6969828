//! An OOM explained, in the trainer detail where a leak's sites are shown: which pattern it was,
//! what was asked against the limit, the line that asked (or why it is unknown), what held the
//! memory, and the trainer's first reason and first remedy. Wide, the live sites are listed as a
//! leak's sites are (sites.rs); narrow, four lines, each cut to the width.
//!
//! Every string here came from a trainer: it goes into spans like any other text, whose control
//! characters ratatui drops when it draws them.

use ratatui::text::{Line, Span};

use super::fmt::{clip, plural};
use super::sites::{self, Room};
use super::theme::Theme;
use crate::core::detect::explanation::Explanation;
use crate::outputs::attribution_text as words;
use crate::units::{bytes, bytes_fine};

/// Live sites listed at most, wide: the explanation shares its column with recent events.
pub const SITES: usize = 3;

pub fn lines(e: &Explanation, room: Room, t: Theme) -> Vec<Line<'static>> {
    if room.callers > 0 {
        wide(e, room, t)
    } else {
        narrow(e, room, t)
    }
}

/// "1.5 GiB asked at oomlib.py:37 in dev_big", or the request and why its line is unknown.
fn asked(e: &Explanation, short: bool, t: Theme) -> Vec<Span<'static>> {
    let mut out = vec![Span::raw(match e.request_bytes {
        Some(r) => format!("{} asked", bytes(r)),
        None => "asked".into(),
    })];
    match &e.failing_site {
        Some(f) => {
            out.push(Span::raw(" at "));
            out.push(Span::styled(f.short(), t.accent()));
            if !f.function.is_empty() {
                out.push(Span::raw(format!(" in {}", f.function)));
            }
        }
        None => out.push(Span::styled(
            format!(" · line unknown: {}", unknown_line(e, short)),
            t.dim(),
        )),
    }
    out
}

/// Why the explanation names no failing line: history was off, or no Python frame asked.
fn unknown_line(e: &Explanation, short: bool) -> &'static str {
    match (e.history, short) {
        (false, true) => "history off",
        (false, false) => "allocation history was not recording",
        (true, true) => "no Python frame",
        (true, false) => "no Python frame asked (raised inside torch, e.g. in backward)",
    }
}

/// "live: 1.2 GiB (95%) at oomlib.py:32 in dev_pin", the largest live site in one line.
fn top_live(e: &Explanation, t: Theme) -> Option<Line<'static>> {
    let s = e.top_live()?;
    let mut l = vec![
        Span::styled("live: ", t.dim()),
        Span::raw(format!("{} (", bytes(s.bytes))),
        Span::styled(words::percent(e.live_share(s)), t.warn()),
        Span::raw(") at "),
        Span::styled(s.short(), t.accent()),
    ];
    if !s.function.is_empty() {
        l.push(Span::raw(format!(" in {}", s.function)));
    }
    if e.live_sites.len() > 1 {
        l.push(Span::styled(
            format!(
                " · {}",
                plural((e.live_sites.len() - 1) as u64, "more site")
            ),
            t.dim(),
        ));
    }
    Some(Line::from(l))
}

/// "limit 4.00 GiB · allocated 1.3 GiB · reserved 3.6 GiB, 2.3 GiB of it free (largest block
/// 13.0 MiB)": the allocator's numbers at the OOM, those known.
fn numbers(e: &Explanation) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(l) = e.limit_bytes {
        parts.push(format!("limit {}", bytes_fine(l)));
    }
    if let Some(a) = e.allocated_bytes {
        parts.push(format!("allocated {}", bytes(a)));
    }
    if let Some(r) = e.reserved_bytes {
        let mut s = format!("reserved {}", bytes(r));
        match (e.reserved_free_bytes, e.largest_free_block_bytes) {
            (Some(f), Some(b)) => s.push_str(&format!(
                ", {} of it free (largest block {})",
                bytes(f),
                bytes(b)
            )),
            (Some(f), None) => s.push_str(&format!(", {} of it free", bytes(f))),
            _ => {}
        }
        parts.push(s);
    }
    (!parts.is_empty()).then(|| parts.join(" · "))
}

/// The first reason (`why: `) or remedy (`fix: `), in as many lines as `width` needs, or cut to
/// one with `one_line`.
fn note(label: &str, text: &str, width: usize, one_line: bool, t: Theme) -> Vec<Line<'static>> {
    let label = Span::styled(format!("{label}: "), t.accent());
    let room = width.saturating_sub(5);
    if one_line {
        // Whitespace (a newline included) as one space, then cut: one row, whatever it held.
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        return vec![Line::from(vec![label, Span::raw(clip(&flat, room))])];
    }
    sites::wrap(text, room.max(20))
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            let lead = if i == 0 {
                label.clone()
            } else {
                Span::raw("     ")
            };
            Line::from(vec![lead, Span::raw(part)])
        })
        .collect()
}

/// Four lines: pattern, request, line and limit; the top live site; why; what to do.
fn narrow(e: &Explanation, room: Room, t: Theme) -> Vec<Line<'static>> {
    let w = usize::from(room.width);
    let mut head = vec![
        Span::styled("OOM ", t.bold()),
        Span::styled(e.pattern.to_string(), t.warn()),
        Span::raw(" · "),
    ];
    head.extend(asked(e, true, t));
    if let Some(l) = e.limit_bytes {
        head.push(Span::styled(format!(" · limit {}", bytes_fine(l)), t.dim()));
    }
    let mut out = vec![Line::from(head)];
    out.extend(top_live(e, t));
    if let Some(r) = e.reasons.first() {
        out.extend(note("why", r, w, true, t));
    }
    if let Some(r) = e.remedies.first() {
        out.extend(note("fix", r, w, true, t));
    }
    out
}

/// The heading, request and numbers, the first reason and remedy whole, then the live sites
/// with their callers.
fn wide(e: &Explanation, room: Room, t: Theme) -> Vec<Line<'static>> {
    let w = usize::from(room.width);
    let mut out = vec![Line::from(vec![
        Span::styled("OOM explained: ", t.bold()),
        Span::styled(e.pattern.to_string(), t.warn()),
    ])];
    if e.failing_site.is_some() {
        out.push(Line::from(asked(e, false, t)));
    } else {
        // Why the line is unknown takes more than the rest of the request's line.
        let request = e
            .request_bytes
            .map_or("asked".into(), |r| format!("{} asked", bytes(r)));
        out.push(Line::raw(request));
        let why = format!("line unknown: {}", unknown_line(e, false));
        out.extend(
            sites::wrap(&why, w.max(20))
                .into_iter()
                .map(|l| Line::styled(l, t.dim())),
        );
    }
    if let Some(n) = numbers(e) {
        out.extend(
            sites::wrap(&n, w.max(20))
                .into_iter()
                .map(|l| Line::styled(l, t.dim())),
        );
    }
    if let Some(r) = e.reasons.first() {
        out.extend(note("why", r, w, false, t));
    }
    if let Some(r) = e.remedies.first() {
        out.extend(note("fix", r, w, false, t));
    }
    if e.live_sites.is_empty() {
        return out;
    }
    let mut head = vec![Span::styled("Live at the OOM", t.bold())];
    if let Some(a) = e.allocated_bytes {
        head.push(Span::styled(format!(" · {} allocated", bytes(a)), t.dim()));
    }
    out.push(Line::from(head));
    let shown = room.sites.min(SITES);
    for s in e.live_sites.iter().take(shown) {
        out.extend(sites::site(s, e.live_share(s), room, t));
    }
    if e.live_sites.len() > shown {
        out.push(sites::more(e.live_sites.len() - shown, t));
    }
    out
}
