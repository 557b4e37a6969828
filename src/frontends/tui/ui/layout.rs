//! Where the tabs and the Processes table's columns are, from the state: drawing and mouse
//! hit-testing both use these, so a click lands on what was drawn there. (Sizes that depend on
//! the terminal alone: tui/geometry.rs.)

use crate::frontends::tui::app::rows::Column;
use crate::frontends::tui::app::state::{App, Screen};

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
