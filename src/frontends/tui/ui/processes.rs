//! Processes: every GPU process and live trainer, one row each, columns chosen for the width.

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::fmt::clip;
use super::layout;
use super::notice;
use super::theme::Theme;
use crate::frontends::tui::app::rows::{Column, ProcRow};
use crate::frontends::tui::app::state::App;
use crate::frontends::tui::geometry;

pub fn render(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let p = &app.procs;
    let mut title = vec![Span::styled(
        format!(" Processes {} of {} ", p.view.len(), p.rows.len()),
        t.bold(),
    )];
    let arrow = if p.desc { "↓" } else { "↑" };
    title.push(Span::styled(
        format!("· sorted by {} {arrow} ", p.sort_column().title()),
        t.dim(),
    ));
    if !p.filter.is_empty() {
        title.push(Span::styled(
            format!("· filter \"{}\" ", p.filter),
            t.accent(),
        ));
    }
    let block = Block::bordered()
        .border_style(t.border())
        .title(Line::from(title));
    f.render_widget(block, area);
    let (head, body) = geometry::table(area);
    let cols = layout::columns(head.width, app.multi_node());
    // The selection marker lives in the first cell, so the first column is two wider.
    let widths: Vec<Constraint> = cols
        .iter()
        .enumerate()
        .map(|(k, (_, w))| Constraint::Length(if k == 0 { w + 2 } else { *w }))
        .collect();
    let first = |k: usize, marker: &'static str, line: Line<'static>| {
        if k == 0 {
            Line::from(
                std::iter::once(Span::raw(marker))
                    .chain(line.spans)
                    .collect::<Vec<_>>(),
            )
            .style(line.style)
        } else {
            line
        }
    };
    let header = Row::new(cols.iter().enumerate().map(|(k, (c, w))| {
        let sorted = *c == p.sort_column();
        let title = if sorted {
            format!("{}{arrow}", c.title())
        } else {
            c.title().to_string()
        };
        let style = if sorted { t.accent() } else { t.bold() };
        Cell::from(first(
            k,
            "  ",
            Line::styled(align(&title, *c, usize::from(*w)), style),
        ))
    }));

    if p.view.is_empty() {
        f.render_widget(
            Table::new(Vec::<Row>::new(), widths)
                .header(header)
                .column_spacing(1),
            head,
        );
        let msg = if p.rows.is_empty() {
            "No GPU processes and no instrumented trainers.".to_string()
        } else {
            format!(
                "No process matches \"{}\" (esc clears the filter).",
                p.filter
            )
        };
        return notice(f, body, vec![Line::styled(msg, t.dim())]);
    }
    let visible = usize::from(body.height);
    let rows =
        p.view
            .iter()
            .enumerate()
            .skip(p.offset)
            .take(visible)
            .filter_map(|(i, r)| p.rows.get(*r).map(|row| (i, row)))
            .map(|(i, row)| {
                let marker = if i == p.selected { "▶ " } else { "  " };
                let cells = cols.iter().enumerate().map(|(k, (c, w))| {
                    Cell::from(first(k, marker, cell(row, *c, usize::from(*w), t)))
                });
                let style = if i == p.selected {
                    t.selected()
                } else {
                    t.text()
                };
                Row::new(cells).style(style)
            });
    let inner = Rect {
        height: head.height + body.height,
        ..head
    };
    f.render_widget(
        Table::new(rows, widths).header(header).column_spacing(1),
        inner,
    );
    let more = p.view.len().saturating_sub(p.offset + visible);
    if more > 0 {
        let msg = format!(" ↓ {more} more ");
        let w = msg.chars().count() as u16;
        let r = Rect::new(area.right().saturating_sub(w + 2), area.bottom() - 1, w, 1);
        f.render_widget(Paragraph::new(Line::styled(msg, t.dim())), r);
    }
}

fn align(s: &str, c: Column, w: usize) -> String {
    let s = clip(s, w);
    if c.numeric() {
        format!("{s:>w$}")
    } else {
        s
    }
}

fn cell(row: &ProcRow, c: Column, w: usize, t: Theme) -> Line<'static> {
    match c {
        Column::Findings => {
            let mut spans = Vec::new();
            for (i, b) in row.badges.iter().enumerate() {
                if i > 0 {
                    spans.push(Span::raw(" "));
                }
                spans.push(Span::styled(b.kind, t.severity(b.critical)));
            }
            Line::from(spans)
        }
        Column::Frag if row.frag.is_some_and(|f| f >= 0.5) => {
            Line::styled(align(row.cell(c), c, w), t.warn())
        }
        Column::Retries if row.retries.is_some_and(|r| r > 0) => {
            Line::styled(align(row.cell(c), c, w), t.warn())
        }
        _ => Line::from(align(row.cell(c), c, w)),
    }
}
