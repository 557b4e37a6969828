//! Where the trainer's memory went at a step peak (docs/categories.md), drawn as the ledger's
//! line is: the parts' sizes with a bar whose parts add up to the peak (parameters, gradients,
//! optimizer state, buffers when there are any, activations and the rest of the peak), then the
//! batch now and the largest predicted to fit, and why the split is partial. Nothing without a
//! split.

use ratatui::text::{Line, Span};

use super::fmt::thousands;
use super::ledger::bar;
use super::theme::Theme;
use crate::core::categories::{fit_basis_text, BatchFit, Split};
use crate::core::snapshot::SessionView;
use crate::units::bytes;
use crate::util::printable::printable;

/// Widest the bar gets.
const BAR_MAX: usize = 40;
/// Narrowest worth drawing.
const BAR_MIN: usize = 8;

/// Each part's glyph, in `Theme::category`'s order: under NO_COLOR the glyph alone tells the
/// parts apart, in the bar and beside each size.
const GLYPHS: [&str; 6] = ["█", "▓", "▒", "▚", "░", "▪"];

struct Part {
    /// Index into `GLYPHS` and `Theme::category`.
    i: usize,
    long: &'static str,
    short: &'static str,
    /// None: not measured (activations the client could not see).
    bytes: Option<u64>,
}

fn parts(s: &Split) -> Vec<Part> {
    let c = &s.measured;
    let part = |i, long, short, bytes| Part {
        i,
        long,
        short,
        bytes,
    };
    let mut out = vec![
        part(0, "parameters", "params", Some(c.parameters_bytes)),
        part(1, "gradients", "grads", Some(c.gradients_bytes)),
        part(2, "optimizer state", "optim", Some(c.optimizer_state_bytes)),
    ];
    if c.buffers_bytes > 0 {
        out.push(part(3, "buffers", "buffers", Some(c.buffers_bytes)));
    }
    let act = c.activations_known().then_some(c.activations_bytes);
    out.push(part(4, "activations", "act", act));
    if let Some(o) = s.other_bytes {
        out.push(part(5, "other", "other", Some(o)));
    }
    out
}

/// The split's lines for `width` cells: the sizes and the bar (one line, or two when narrow),
/// then the batch and the partial reasons (one line, or two when they do not fit beside each
/// other). Empty when the trainer sent no split.
pub fn lines(s: &SessionView, width: u16, t: Theme) -> Vec<Line<'static>> {
    let Some(split) = s.categories.as_ref() else {
        return Vec::new();
    };
    let width = usize::from(width);
    let mut out = sizes(split, width, t);
    let batch = batch(split, s.batch_fit.as_ref(), s.largest_safe_batch, t);
    let partial = partial(split, width, t);
    match (batch.is_empty(), partial.is_empty()) {
        (true, true) => {}
        (false, true) => out.push(Line::from(clipped(batch, width))),
        (true, false) => out.push(Line::from(clipped(partial, width))),
        (false, false) => {
            let mut joined = batch.clone();
            joined.push(Span::styled(" · ", t.dim()));
            joined.extend(partial.iter().cloned());
            if cells(&joined) <= width {
                out.push(Line::from(joined));
            } else {
                out.push(Line::from(clipped(batch, width)));
                out.push(Line::from(clipped(partial, width)));
            }
        }
    }
    out
}

/// "split at step 3, peak 10.2 GiB  █ parameters 1.0 GiB  ▓ gradients …  ████▓▓▒▒░░░░▪▪":
/// long names when they leave the bar room, else short ones, else the bar beside the head and
/// the sizes below it, on as many lines as they take.
fn sizes(s: &Split, width: usize, t: Theme) -> Vec<Line<'static>> {
    let parts = parts(s);
    let mut head = vec![
        Span::styled("split at step ", t.dim()),
        Span::raw(thousands(s.measured.step)),
    ];
    if let Some(p) = s.peak_bytes {
        head.push(Span::styled(", peak ", t.dim()));
        head.push(Span::raw(bytes(p)));
    }
    for long in [true, false] {
        let mut spans = head.clone();
        spans.push(Span::raw("  "));
        spans.extend(joined(legend(&parts, long, t), "  "));
        let room = width.saturating_sub(cells(&spans) + 2).min(BAR_MAX);
        if room >= BAR_MIN {
            spans.extend(bar_spans(&parts, room, t));
            return vec![Line::from(spans)];
        }
    }
    let room = width.saturating_sub(cells(&head) + 2).min(BAR_MAX);
    let mut first = head;
    if room >= BAR_MIN {
        first.extend(bar_spans(&parts, room, t));
    }
    let mut out = vec![Line::from(clipped(first, width))];
    // The sizes on one line if they fit (long names, else short ones a space apart: the glyphs
    // part them), else short names as many to a line as fit, a size never split over two.
    for (long, gap) in [(true, "  "), (false, "  "), (false, " ")] {
        let one = joined(legend(&parts, long, t), gap);
        if cells(&one) <= width {
            out.push(Line::from(one));
            return out;
        }
    }
    let mut line: Vec<Span<'static>> = Vec::new();
    for item in legend(&parts, false, t) {
        if !line.is_empty() && cells(&line) + 2 + cells(&item) > width {
            out.push(Line::from(clipped(std::mem::take(&mut line), width)));
        }
        if !line.is_empty() {
            line.push(Span::raw("  "));
        }
        line.extend(item);
    }
    if !line.is_empty() {
        out.push(Line::from(clipped(line, width)));
    }
    out
}

/// Each part's "█ parameters 1.0 GiB": glyph and name in the part's style, the size plain, as
/// the chart's legend above is.
fn legend(parts: &[Part], long: bool, t: Theme) -> Vec<Vec<Span<'static>>> {
    parts
        .iter()
        .map(|p| {
            let name = if long { p.long } else { p.short };
            let size = match p.bytes {
                Some(b) => Span::raw(bytes(b)),
                None if long => Span::styled("not measured", t.dim()),
                None => Span::styled("?", t.dim()),
            };
            vec![
                Span::styled(format!("{} {name} ", GLYPHS[p.i]), t.category(p.i)),
                size,
            ]
        })
        .collect()
}

/// The items on one line, `gap` apart.
fn joined(items: Vec<Vec<Span<'static>>>, gap: &'static str) -> Vec<Span<'static>> {
    let mut out = Vec::new();
    for (k, item) in items.into_iter().enumerate() {
        if k > 0 {
            out.push(Span::raw(gap));
        }
        out.extend(item);
    }
    out
}

/// The bar, `cells` wide, led by two spaces; nothing when the parts add up to nothing.
fn bar_spans(parts: &[Part], cells: usize, t: Theme) -> Vec<Span<'static>> {
    let sizes: Vec<u64> = parts.iter().map(|p| p.bytes.unwrap_or(0)).collect();
    if sizes.iter().all(|b| *b == 0) {
        return Vec::new();
    }
    let mut out = vec![Span::raw("  ")];
    for (n, p) in bar(&sizes, cells).into_iter().zip(parts) {
        if n > 0 {
            out.push(Span::styled(GLYPHS[p.i].repeat(n), t.category(p.i)));
        }
    }
    out
}

/// "batch 16 now · 15 fits (scaled from batch 16)", the fit as the findings' remedies
/// word it; empty when the batch is not known.
fn batch(s: &Split, fit: Option<&BatchFit>, largest: Option<u64>, t: Theme) -> Vec<Span<'static>> {
    let Some(now) = s.measured.batch_size else {
        return Vec::new();
    };
    let mut out = vec![
        Span::styled("batch ", t.dim()),
        Span::raw(thousands(now)),
        Span::styled(" now · ", t.dim()),
    ];
    match fit.map(|f| f.largest_safe_batch).or(largest) {
        Some(0) => {
            out.push(Span::styled("no batch fits", t.crit()));
            if let Some(f) = fit {
                out.push(Span::styled(
                    format!(
                        " ({} does not scale with the batch, of {})",
                        bytes(f.fixed_bytes),
                        bytes(f.limit_bytes)
                    ),
                    t.dim(),
                ));
            }
        }
        Some(n) => {
            let style = if n < now { t.warn() } else { t.ok() };
            out.push(Span::styled(format!("{} fits", thousands(n)), style));
            if let Some(f) = fit {
                out.push(Span::styled(
                    format!(" ({})", fit_basis_text(f, now)),
                    t.dim(),
                ));
            }
        }
        None => out.push(Span::styled("what fits is not known", t.dim())),
    }
    out
}

/// "partial: activations_unmeasured: the trainer's own …; zero3_partitions: …", or just the
/// codes when the reasons do not fit `width`; escaped, as every string a trainer sends.
fn partial(s: &Split, width: usize, t: Theme) -> Vec<Span<'static>> {
    let reasons = &s.measured.partial;
    if reasons.is_empty() {
        return Vec::new();
    }
    let label = Span::styled("partial: ", t.warn());
    let whole = printable(&reasons.join("; ")).into_owned();
    let text = if label.width() + whole.chars().count() <= width {
        whole
    } else {
        let codes: Vec<&str> = reasons
            .iter()
            .map(|r| r.split(':').next().unwrap_or(r).trim())
            .collect();
        printable(&codes.join(", ")).into_owned()
    };
    vec![label, Span::raw(text)]
}

fn cells(spans: &[Span]) -> usize {
    spans.iter().map(Span::width).sum()
}

/// `spans` cut to `width` cells, the cut marked with "…".
fn clipped(spans: Vec<Span<'static>>, width: usize) -> Vec<Span<'static>> {
    if cells(&spans) <= width {
        return spans;
    }
    if width == 0 {
        return Vec::new();
    }
    // At least 1 at each span (a span that would leave 0 is the cut one), so room for the mark.
    let mut left = width;
    let mut out = Vec::new();
    for s in spans {
        let n = s.width();
        if n < left {
            left -= n;
            out.push(s);
        } else {
            // This span reaches the edge with more after it: its last cell is the mark.
            let mut cut: String = s.content.chars().take(left - 1).collect();
            cut.push('…');
            out.push(Span::styled(cut, s.style));
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests;
