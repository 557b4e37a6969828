//! The trainer's ledger as one line: NVML's figure for the process split into live tensors,
//! the allocator's cache and what lies outside the allocator, with a bar whose parts add up to
//! the figure. A part that cannot be known says why instead.

use ratatui::text::{Line, Span};

use super::fmt::clip;
use super::theme::{Theme, RESERVED, USED};
use crate::core::ledger::Ledger;
use crate::units::bytes;

/// The bar's glyph for memory outside the allocator (free memory, elsewhere, is `FREE`).
const OUTSIDE: &str = "▒";
/// Widest the bar gets.
const BAR_MAX: usize = 40;
/// Narrowest worth drawing.
const BAR_MIN: usize = 8;

pub fn line(l: &Ledger, width: u16, growing: bool, t: Theme) -> Line<'static> {
    let width = width as usize;
    let nvml = l.nvml_used_bytes.map(bytes).unwrap_or_else(|| "?".into());
    let outside_style = if growing { t.warn() } else { t.text() };
    let (Some(a), Some(c), Some(o)) =
        (l.allocated_bytes, l.cached_bytes, l.outside_allocator_bytes)
    else {
        let head = format!("NVML {nvml} · outside the allocator: ? ");
        let why = l.unknown.as_deref().unwrap_or("not known");
        let room = width.saturating_sub(head.chars().count() + 2);
        return Line::from(vec![
            Span::styled(head, t.dim()),
            Span::styled(format!("({})", clip(why, room)), t.dim()),
        ]);
    };
    let mut spans = vec![
        Span::styled("NVML ", t.dim()),
        Span::raw(nvml),
        Span::styled(" = tensors ", t.dim()),
        Span::styled(bytes(a), t.used()),
        Span::styled(" + cached ", t.dim()),
        Span::styled(bytes(c), t.reserved()),
        Span::styled(
            if width >= 100 {
                " + outside the allocator "
            } else {
                " + outside "
            },
            t.dim(),
        ),
        Span::styled(bytes(o), outside_style),
    ];
    let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
    let room = width.saturating_sub(used + 2).min(BAR_MAX);
    let total = a.saturating_add(c).saturating_add(o);
    if room >= BAR_MIN && total > 0 {
        spans.push(Span::raw("  "));
        for (cells, glyph, style) in bar(&[a, c, o], room)
            .into_iter()
            .zip([
                (USED, t.used()),
                (RESERVED, t.reserved()),
                (OUTSIDE, outside_style),
            ])
            .map(|(n, (g, s))| (n, g, s))
        {
            if cells > 0 {
                spans.push(Span::styled(glyph.repeat(cells), style));
            }
        }
    }
    Line::from(spans)
}

/// Cells for each part of a bar `cells` wide: proportional, largest remainders first, and every
/// part that is not nothing gets at least one cell when there are cells enough.
pub(super) fn bar(parts: &[u64], cells: usize) -> Vec<usize> {
    let total: u128 = parts.iter().map(|p| *p as u128).sum();
    if total == 0 {
        return vec![0; parts.len()];
    }
    let mut out: Vec<usize> = parts
        .iter()
        .map(|p| (*p as u128 * cells as u128 / total) as usize)
        .collect();
    for (i, p) in parts.iter().enumerate() {
        if *p > 0 && out[i] == 0 {
            out[i] = 1;
        }
    }
    // Take back from the largest while over, give to the largest remainder while under.
    while out.iter().sum::<usize>() > cells {
        if let Some(i) = (0..out.len()).max_by_key(|i| out[*i]) {
            out[i] -= 1;
        }
    }
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by_key(|i| std::cmp::Reverse((parts[*i] as u128 * cells as u128) % total));
    let mut k = 0;
    while out.iter().sum::<usize>() < cells {
        out[order[k % order.len()]] += 1;
        k += 1;
    }
    out
}

#[cfg(test)]
mod tests;
