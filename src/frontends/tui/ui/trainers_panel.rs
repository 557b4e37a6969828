//! The overview's trainer table, below the GPU blocks when there is room.

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Row, Table};
use ratatui::Frame;

use super::fmt::clip;
use super::theme::Theme;
use crate::frontends::tui::app::rows::{compare, Column, ProcRow};
use crate::frontends::tui::app::state::App;

/// Live trainers, those with firing findings first: what to look at, below the GPUs when
/// there is room.
pub(super) fn trainers(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let mut rows: Vec<&ProcRow> = app
        .procs
        .rows
        .iter()
        .filter(|r| r.key.session.is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    rows.sort_by(|a, b| compare(a, b, Column::Findings, true));
    let area = Rect {
        height: area.height.min(rows.len() as u16 + 3),
        ..area
    };
    let mut cols = [
        (Column::Name, 26),
        (Column::Gpu, 4),
        (Column::Pid, 12),
        (Column::Step, 8),
        (Column::Floor, 10),
        (Column::Peak, 10),
        (Column::Reserved, 10),
        (Column::Frag, 5),
        (Column::Findings, 12),
    ];
    // Room left over goes to names cut short first, then to the findings' badges: a wide
    // terminal shows `demo-near-limit r0/1 · gpumon` whole, not beside a blank column.
    let used: usize = cols.iter().map(|(_, w)| *w).sum::<usize>() + cols.len() - 1;
    let spare = usize::from(area.width.saturating_sub(2)).saturating_sub(used);
    let longest = rows
        .iter()
        .map(|r| r.cell(Column::Name).chars().count())
        .max()
        .unwrap_or(0);
    let to_names = longest.saturating_sub(cols[0].1).min(spare);
    cols[0].1 += to_names;
    if let Some(last) = cols.last_mut() {
        last.1 += spare - to_names;
    }
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
    f.render_widget(
        Table::new(body, widths)
            .header(header)
            .column_spacing(1)
            .block(Block::bordered().border_style(t.border()).title(title)),
        area,
    );
}

fn pad(s: &str, c: Column, w: usize) -> String {
    let s = clip(s, w);
    if c.numeric() {
        format!("{s:>w$}")
    } else {
        s
    }
}
