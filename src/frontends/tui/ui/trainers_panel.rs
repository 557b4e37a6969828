//! The overview's trainer table, below the GPUs: which trainer has a problem and what it is.

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::fmt::{clip, plural};
use super::theme::Theme;
use crate::frontends::tui::app::rows::{compare, Column, ProcRow};
use crate::frontends::tui::app::state::App;

/// Display order, left to right.
const SHOWN: [Column; 9] = [
    Column::Name,
    Column::Gpu,
    Column::Pid,
    Column::Step,
    Column::Floor,
    Column::Peak,
    Column::Reserved,
    Column::Frag,
    Column::Findings,
];

/// After the name and the findings, which columns survive a narrow terminal, first to last.
const BY_PRIORITY: [Column; 7] = [
    Column::Gpu,
    Column::Floor,
    Column::Peak,
    Column::Reserved,
    Column::Step,
    Column::Frag,
    Column::Pid,
];

/// Names are cut no shorter than this ("PROCESS / JOB" and a little).
const NAME_MIN: usize = 16;

/// Live trainers (the rows the table lists), and how many of them have firing findings.
pub(super) fn live(app: &App) -> (usize, usize) {
    let rows = app.procs.rows.iter().filter(|r| r.key.session.is_some());
    rows.fold((0, 0), |(n, f), r| (n + 1, f + usize::from(r.firing())))
}

/// Live trainers, those with firing findings first. With no room for a table, one line says
/// where they are listed.
pub(super) fn trainers(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let mut rows: Vec<&ProcRow> = app
        .procs
        .rows
        .iter()
        .filter(|r| r.key.session.is_some())
        .collect();
    if rows.is_empty() || area.height == 0 {
        return;
    }
    rows.sort_by(|a, b| compare(a, b, Column::Findings, true));
    if area.height < 4 {
        return hint(f, area, &rows, t);
    }
    let area = Rect {
        height: area.height.min((rows.len() as u16).saturating_add(3)),
        ..area
    };
    let name_need = rows
        .iter()
        .map(|r| r.cell(Column::Name).chars().count())
        .max()
        .unwrap_or(0);
    let badges_need = rows.iter().map(|r| badges_width(r)).max().unwrap_or(0);
    let cols = columns(
        usize::from(area.width.saturating_sub(2)),
        name_need,
        badges_need,
    );
    let header = Row::new(
        cols.iter()
            .map(|(c, w)| Cell::from(Line::styled(pad(c.title(), *c, *w), t.bold()))),
    );
    let body = rows.iter().map(|r| {
        Row::new(cols.iter().map(|(c, w)| {
            if *c == Column::Findings {
                let spans: Vec<Span> = r
                    .badges
                    .iter()
                    .flat_map(|b| [Span::styled(b.kind, t.severity(b.critical)), Span::raw(" ")])
                    .collect();
                Cell::from(Line::from(spans))
            } else {
                Cell::from(pad(r.cell(*c), *c, *w))
            }
        }))
    });
    let widths = cols.iter().map(|(_, w)| Constraint::Length(*w as u16));
    let title = Line::from(vec![
        Span::styled(format!(" Trainers {} ", rows.len()), t.bold()),
        Span::styled("· enter on Processes for the chart ", t.dim()),
    ]);
    let mut block = Block::bordered().border_style(t.border()).title(title);
    // Firing ones come first, so those cut off are the quiet ones; say where they are.
    let cut = rows.len().saturating_sub(usize::from(area.height - 3));
    if cut > 0 {
        block = block.title_bottom(
            Line::styled(format!(" {cut} more: 2 Processes lists them "), t.dim()).right_aligned(),
        );
    }
    f.render_widget(
        Table::new(body, widths)
            .header(header)
            .column_spacing(1)
            .block(block),
        area,
    );
}

/// One line in place of the table: how many trainers, how many with findings, which key.
fn hint(f: &mut Frame, area: Rect, rows: &[&ProcRow], t: Theme) {
    let firing = rows.iter().filter(|r| r.firing()).count();
    let line = Line::from(vec![
        Span::styled(
            format!(" {}", plural(rows.len() as u64, "trainer")),
            t.bold(),
        ),
        Span::styled(
            format!(" ({firing} with findings)"),
            if firing > 0 { t.crit() } else { t.dim() },
        ),
        Span::styled(": 2 Processes lists them", t.dim()),
    ]);
    f.render_widget(
        Paragraph::new(line),
        Rect {
            y: area.bottom() - 1,
            height: 1,
            ..area
        },
    );
}

/// Cells the row's badges take, one space between them.
fn badges_width(r: &ProcRow) -> usize {
    let n: usize = r.badges.iter().map(|b| b.kind.chars().count() + 1).sum();
    n.saturating_sub(1)
}

fn width(c: Column) -> usize {
    match c {
        Column::Gpu => 4,
        Column::Pid => 12,
        Column::Step => 8,
        Column::Frag => 5,
        _ => 10,
    }
}

/// Columns for `room` cells: the name and the findings first (which trainer, what is wrong),
/// then others while they fit. What is left goes to a name still cut, then to the findings,
/// so no column stands blank beside a cut name.
fn columns(room: usize, name_need: usize, badges_need: usize) -> Vec<(Column, usize)> {
    let findings = badges_need.max(Column::Findings.title().len());
    let name = name_need.clamp(NAME_MIN, (room / 2).max(NAME_MIN));
    let mut left = room.saturating_sub(name + 1 + findings);
    let mut keep = Vec::new();
    for c in BY_PRIORITY {
        if width(c) < left {
            left -= width(c) + 1;
            keep.push(c);
        }
    }
    let to_name = name_need.saturating_sub(name).min(left);
    SHOWN
        .iter()
        .filter_map(|c| match c {
            Column::Name => Some((*c, name + to_name)),
            Column::Findings => Some((*c, findings + left - to_name)),
            c if keep.contains(c) => Some((*c, width(*c))),
            _ => None,
        })
        .collect()
}

fn pad(s: &str, c: Column, w: usize) -> String {
    let s = clip(s, w);
    if c.numeric() {
        format!("{s:>w$}")
    } else {
        s
    }
}

#[cfg(test)]
mod tests;
