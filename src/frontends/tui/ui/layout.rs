//! Where things are on screen, as pure functions of the terminal size (and, for tabs and
//! columns, of the state). Drawing and mouse hit-testing both use these, so a click lands on
//! what was drawn there.

use ratatui::layout::Rect;

use crate::frontends::tui::app::rows::Column;
use crate::frontends::tui::app::state::{App, Screen};

/// Smallest terminal the screens are laid out for; below it a notice is shown instead.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 10;

pub struct Areas {
    pub header: Rect,
    pub tabs: Rect,
    pub body: Rect,
    pub footer: Rect,
}

pub fn areas(area: Rect) -> Areas {
    let h = area.height;
    let row = |y: u16, height: u16| {
        Rect::new(
            area.x,
            area.y + y.min(h),
            area.width,
            height.min(h.saturating_sub(y)),
        )
    };
    Areas {
        header: row(0, 2),
        tabs: row(2, 1),
        body: row(3, h.saturating_sub(4)),
        footer: row(h.saturating_sub(1), 1),
    }
}

fn body(width: u16, height: u16) -> Rect {
    areas(Rect::new(0, 0, width, height)).body
}

/// Data rows of the Processes table that fit: the body less its border and column header.
pub fn table_rows(width: u16, height: u16) -> usize {
    usize::from(body(width, height).height.saturating_sub(3))
}

/// The Processes table inside its border: (column header row, data rows).
pub fn table(body: Rect) -> (Rect, Rect) {
    let inner = inset(body);
    let header = Rect {
        height: inner.height.min(1),
        ..inner
    };
    let rows = Rect {
        y: inner.y + header.height,
        height: inner.height.saturating_sub(1),
        ..inner
    };
    (header, rows)
}

/// The Findings screen: (list, detail of the selected finding).
pub fn findings(body: Rect) -> (Rect, Rect) {
    let detail = if body.height >= 30 { 10 } else { 7 }.min(body.height / 2);
    let list = Rect {
        height: body.height - detail,
        ..body
    };
    let pane = Rect {
        y: body.y + list.height,
        height: detail,
        ..body
    };
    (list, pane)
}

/// Lines per item in the Findings list: a status line and the message.
pub const FINDING_LINES: u16 = 2;

pub fn finding_rows(width: u16, height: u16) -> usize {
    let (list, _) = findings(body(width, height));
    usize::from(list.height.saturating_sub(2) / FINDING_LINES)
}

pub fn inset(r: Rect) -> Rect {
    Rect {
        x: r.x.saturating_add(1),
        y: r.y.saturating_add(1),
        width: r.width.saturating_sub(2),
        height: r.height.saturating_sub(2),
    }
}

/// Columns shown at `width` (inside the table border), left to right, with their widths. The
/// highest-priority columns are kept; PROCESS / JOB takes the room left over.
pub fn columns(width: u16, multi_node: bool) -> Vec<(Column, u16)> {
    // Two cells of selection marker, then one space between columns.
    let mut room = i32::from(width) - 2;
    let mut keep = Vec::new();
    for c in Column::BY_PRIORITY {
        if c == Column::Node && !multi_node {
            continue;
        }
        let need = i32::from(c.width()) + 1;
        if need <= room {
            room -= need;
            keep.push(c);
        }
    }
    let extra = room.max(0) as u16;
    Column::ALL
        .iter()
        .filter(|c| keep.contains(c))
        .map(|c| match c {
            Column::Name => (*c, c.width() + extra),
            _ => (*c, c.width()),
        })
        .collect()
}

/// The column under x (relative to the table's inner left edge).
pub fn column_at(x: u16, width: u16, multi_node: bool) -> Option<Column> {
    let mut left = 2;
    for (c, w) in columns(width, multi_node) {
        if x >= left && x < left + w {
            return Some(c);
        }
        left += w + 1;
    }
    None
}

/// Tab labels and where each starts; the Findings tab carries the firing count.
pub fn tabs(app: &App) -> Vec<(Screen, String, u16)> {
    let mut x = 0;
    Screen::ALL
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let label = match s {
                Screen::Findings if app.firing() > 0 => {
                    format!(" {} {} ({}) ", i + 1, s.title(), app.firing())
                }
                _ => format!(" {} {} ", i + 1, s.title()),
            };
            let at = x;
            x += label.chars().count() as u16 + 1;
            (*s, label, at)
        })
        .collect()
}

pub fn tab_at(app: &App, x: u16) -> Option<Screen> {
    tabs(app)
        .into_iter()
        .find(|(_, label, at)| x >= *at && x < at + label.chars().count() as u16)
        .map(|(s, _, _)| s)
}
