//! Drawing: `render` is a pure function of `&App` onto a frame; one file per screen.

mod categories;
mod findings;
pub mod fmt;
mod gauge;
mod gpu_list;
mod header;
pub(crate) mod help;
mod job_lines;
pub mod layout;
mod ledger;
mod oom;
mod overview;
mod process;
mod processes;
mod sites;
mod spark;
pub mod theme;
mod trainer;
mod trainers_panel;

use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

use crate::frontends::tui::app::state::{App, Screen};
use crate::frontends::tui::geometry;
use theme::Theme;

pub fn render(f: &mut Frame, app: &App) {
    let area = f.area();
    let theme = Theme::new(app.color);
    if area.width < geometry::MIN_WIDTH || area.height < geometry::MIN_HEIGHT {
        let msg = format!(
            "Terminal too small ({}x{}): gpumon tui needs {}x{}. Enlarge it, or q to quit.",
            area.width,
            area.height,
            geometry::MIN_WIDTH,
            geometry::MIN_HEIGHT
        );
        f.render_widget(Paragraph::new(msg).wrap(Wrap { trim: true }), area);
        return;
    }
    let a = geometry::areas(area);
    header::render(f, a.header, app, theme);
    header::tabs(f, a.tabs, app, theme);
    match (&app.detail, app.screen) {
        (Some(key), _) => trainer::render(f, a.body, app, key, theme),
        (None, Screen::Overview) => overview::render(f, a.body, app, theme),
        (None, Screen::Processes) => processes::render(f, a.body, app, theme),
        (None, Screen::Findings) => findings::render(f, a.body, app, theme),
    }
    header::footer(f, a.footer, app, theme);
    if app.help {
        help::render(f, area, app.help_page, theme);
    }
}

/// A centred message for empty states.
fn notice(f: &mut Frame, area: Rect, lines: Vec<Line<'static>>) {
    let width = usize::from(area.width.saturating_sub(4)).max(1);
    // Wrapped height, roughly: enough to centre the block.
    let wrapped: usize = lines.iter().map(|l| l.width().max(1).div_ceil(width)).sum();
    let h = (wrapped as u16).min(area.height);
    let y = area.y + area.height.saturating_sub(h) / 2;
    let r = Rect::new(
        area.x + 2,
        y,
        width as u16,
        area.height.saturating_sub(y - area.y),
    );
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), r);
}
