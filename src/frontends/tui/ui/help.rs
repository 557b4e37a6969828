//! The help overlay (?).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};
use ratatui::Frame;

use super::theme::Theme;

const KEYS: [(&str, &str); 18] = [
    ("tab ← → h l 1-3", "switch screen"),
    ("↑ ↓ j k", "move the selection, scroll"),
    ("PgUp PgDn ^u ^d", "page"),
    ("g G Home End", "first, last"),
    ("enter", "open the trainer's detail"),
    ("esc backspace", "back, close, clear the filter"),
    ("s  S", "sort by the next column, reverse"),
    ("/", "filter processes by text"),
    ("z", "trainer chart: floor only / all lines"),
    ("?", "this help"),
    ("q  ^c", "quit"),
    ("mouse", "tabs, rows and column titles click;"),
    ("", "the wheel scrolls; a second click opens"),
    ("", ""),
    ("FLOOR", "allocated at step boundaries: the leak signal"),
    ("PEAK RESERVED", "from torch.cuda.memory_stats()"),
    ("FRAG", "(reserved − allocated) / reserved"),
    ("OUTSIDE", "used − reserved, outside PyTorch (? unknown)"),
];

pub fn render(f: &mut Frame, area: Rect, t: Theme) {
    let w = 66.min(area.width);
    let h = (KEYS.len() as u16 + 2).min(area.height);
    let r = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    let lines: Vec<Line> = KEYS
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!(" {k:<16} "), t.accent()),
                Span::raw(*what),
            ])
        })
        .collect();
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .title(Span::styled(" gpumon tui: keys ", t.bold()))
                .title_bottom(Line::styled(" any key closes ", t.dim()).right_aligned()),
        ),
        r,
    );
}
