//! Findings: firing, then pending, then recently resolved, newest first in each, two lines each;
//! the selected one's full message and hint below.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;

use super::fmt::{ago, clip, clip_keeping_last, duration};
use super::notice;
use super::sites::wrap;
use super::theme::Theme;
use crate::frontends::tui::app::state::{App, Origin};
use crate::frontends::tui::finding::{Finding, FindingView, State};
use crate::frontends::tui::geometry::{self, FINDING_LINES};

pub fn render(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let items = &app.findings.items;
    let firing = items.iter().filter(|(_, f)| f.firing()).count();
    let resolved = items
        .iter()
        .filter(|(_, f)| f.state() == State::Resolved)
        .count();
    let (list, pane) = geometry::findings(area);
    let block = Block::bordered()
        .border_style(t.border())
        .title(Line::from(vec![
            Span::styled(" Findings ", t.bold()),
            Span::styled(
                format!("· {firing} firing · {resolved} resolved "),
                if firing > 0 { t.crit() } else { t.dim() },
            ),
        ]));
    let inner = block.inner(list);
    f.render_widget(block, list);
    if items.is_empty() {
        return notice(f, inner, empty(app, t));
    }
    let per = usize::from(FINDING_LINES);
    let shown = usize::from(inner.height) / per;
    let mut lines = Vec::new();
    for (i, (n, fi)) in items
        .iter()
        .enumerate()
        .skip(app.findings.offset)
        .take(shown)
    {
        let sel = i == app.findings.selected;
        let mut l1 = status(app, *n, fi, inner.width, t);
        let mut l2 = Line::from(vec![
            Span::raw("    "),
            // The named line is the message's last clause: the cut falls before it.
            Span::raw(clip_keeping_last(
                &fi.message,
                usize::from(inner.width).saturating_sub(4),
            )),
        ]);
        if sel {
            l1 = l1.patch_style(t.selected());
            l2 = l2.patch_style(t.selected());
        }
        lines.push(l1);
        lines.push(l2);
    }
    f.render_widget(Paragraph::new(lines), inner);
    if let Some((n, fi)) = app.findings.selected_item() {
        detail(f, pane, app, *n, fi, t);
    }
}

fn empty(app: &App, t: Theme) -> Vec<Line<'static>> {
    if app
        .nodes
        .iter()
        .all(|n| matches!(n.origin, Origin::InProcess { .. }))
    {
        return vec![
            Line::styled("Findings are unavailable", t.warn()),
            Line::from("No daemon is running: the TUI reads NVML itself, and detection runs in the daemon."),
            Line::styled("Start `gpumon daemon` (or pass --connect URL) to see findings.", t.dim()),
        ];
    }
    vec![
        Line::styled("No findings", t.ok()),
        Line::styled(
            "Detection flags leaks, near-limit pressure, fragmentation, OOMs and crashes of instrumented trainers.",
            t.dim(),
        ),
    ]
}

fn status(app: &App, node: usize, f: &Finding, width: u16, t: Theme) -> Line<'static> {
    let (mark, style) = match f.state() {
        State::Firing => ("●", t.severity(f.critical())),
        State::Pending => ("○", t.warn()),
        State::Resolved => ("✓", t.ok()),
        State::Other => ("?", t.dim()),
    };
    let mut who = Vec::new();
    if let Some(j) = &f.subject.job {
        who.push(match f.subject.rank {
            Some(r) => format!("{j} r{r}"),
            None => j.clone(),
        });
    }
    if f.subject.pid != 0 {
        who.push(format!("pid {}", f.subject.pid));
    }
    if let Some(g) = &f.gpu {
        who.push(format!("GPU {g}"));
    }
    if app.multi_node() {
        if let Some(n) = app.nodes.get(node) {
            who.push(n.name.clone());
        }
    }
    let when = match f.state() {
        State::Resolved => f
            .resolved_ts
            .map(|ts| format!("resolved {}", ago(app.now, ts))),
        State::Firing => f
            .since
            .or(Some(f.first_ts))
            .map(|ts| format!("firing for {}", duration(app.now - ts))),
        _ => f
            .since
            .or(Some(f.first_ts))
            .map(|ts| format!("{} for {}", f.state.as_str(), duration(app.now - ts))),
    }
    .unwrap_or_else(|| f.state.as_str().to_string());
    let head = format!(" {mark} {:<13} {:<8} ", f.label(), f.severity.as_str());
    let rest = format!("{when} · {}", who.join(" · "));
    let room = usize::from(width).saturating_sub(head.chars().count());
    Line::from(vec![
        Span::styled(head, style),
        Span::raw(clip(&rest, room)),
    ])
}

fn detail(f: &mut Frame, area: Rect, app: &App, node: usize, fi: &Finding, t: Theme) {
    let width = usize::from(area.width.saturating_sub(2)).max(1);
    let rows = usize::from(area.height.saturating_sub(2));
    // Inside the border: a status line cut to fit rather than wrapped onto the message's line.
    let mut lines = vec![status(app, node, fi, area.width.saturating_sub(2), t)];
    let survived = fi.survived().then(|| {
        Line::styled(
            "survived: the run went on (samples came after the OOM)",
            t.ok(),
        )
    });
    // An explained OOM's first remedy is for its pattern; the hint is for any OOM.
    let remedy = fi.explanation().and_then(|e| e.remedies.first());
    let tip = match (remedy, &fi.hint) {
        (Some(r), _) => Some(("fix: ", r.as_str())),
        (None, Some(h)) => Some(("hint: ", h.as_str())),
        (None, None) => None,
    };
    // The remedy is what a small pane must keep: the tip gets its room first (all but the
    // status line and one line of message), the message what is left.
    let fixed = 1 + usize::from(survived.is_some());
    let tip_lines = tip
        .map(|(label, text)| fitted(label, text, width, rows.saturating_sub(fixed + 1).max(1)))
        .unwrap_or_default();
    let message_rows = rows.saturating_sub(fixed + tip_lines.len()).max(1);
    for l in wrap(&shortened(&fi.message, width, message_rows), width) {
        lines.push(Line::from(l));
    }
    lines.extend(survived);
    for (i, l) in tip_lines.into_iter().enumerate() {
        match (i, tip) {
            (0, Some((label, _))) => {
                let rest = l.strip_prefix(label).unwrap_or(&l).to_string();
                lines.push(Line::from(vec![
                    Span::styled(label, t.accent()),
                    Span::raw(rest),
                ]));
            }
            _ => lines.push(Line::from(l)),
        }
    }
    // The footer says it too: this line only where there is room for it.
    if (!fi.subject.session.is_empty() || fi.subject.pid != 0) && lines.len() < rows {
        lines.push(Line::styled(
            "enter: open the trainer's chart and events",
            t.dim(),
        ));
    }
    let block = Block::bordered()
        .border_style(t.border())
        .title(Span::styled(" Selected ", t.bold()));
    f.render_widget(Paragraph::new(lines).block(block), area);
}

/// `label` and `text` in lines of `width`, at most `rows`: whole when they fit; else the remedy
/// alone (what follows the hint's "why: "), then cut keeping its last clause, so that what to
/// do is never what the cut removes.
fn fitted(label: &str, text: &str, width: usize, rows: usize) -> Vec<String> {
    let whole = wrap(&format!("{label}{text}"), width);
    if whole.len() <= rows {
        return whole;
    }
    let remedy = text.split_once(": ").map_or(text, |(_, r)| r);
    let tip = format!("{label}{}", shortened(remedy, width, rows));
    let mut out = wrap(&tip, width);
    out.truncate(rows);
    out
}

/// `s` cut (keeping its last clause) until its words fit `rows` lines of `width`.
fn shortened(s: &str, width: usize, rows: usize) -> String {
    let mut max = (width * rows).max(1);
    loop {
        let cut = clip_keeping_last(s, max);
        if wrap(&cut, width).len() <= rows || max <= width {
            return cut;
        }
        max -= width.div_ceil(4).max(1);
    }
}
