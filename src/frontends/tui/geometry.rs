//! Where things are on screen, as pure functions of the terminal size. The state pages and
//! scrolls by these, input hit-tests with them and drawing lays out by them, so a click lands on
//! what was drawn there. (Tabs and table columns, which depend on the state: ui/layout.rs.)

use ratatui::layout::Rect;

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
