//! The help overlay (?): the keys on its first page, every column and word the screens
//! abbreviate on its second (`?` again turns the page), so that none is left unexplained at
//! 80x24.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};
use ratatui::Frame;

use super::theme::Theme;

/// Pages of (key or word, what it means); a blank key continues the line above.
pub const PAGES: [(&str, &[(&str, &str)]); 2] = [
    (" gpumon tui: keys ", &KEYS),
    (" gpumon tui: columns and words ", &WORDS),
];

const KEYS: [(&str, &str); 13] = [
    ("tab ← → h l 1-3", "switch screen"),
    ("↑ ↓ j k", "move the selection, scroll"),
    ("PgUp PgDn ^u ^d", "page"),
    ("g G Home End", "first, last"),
    ("enter", "open the trainer's detail"),
    ("esc backspace", "back, close, clear the filter"),
    ("s  S", "sort by the next column, reverse"),
    ("/", "filter processes by text"),
    ("z", "trainer chart: floor only / all lines"),
    ("?", "this help; again: columns and words"),
    ("q  ^c", "quit"),
    ("mouse", "tabs, rows and column titles click;"),
    ("", "the wheel scrolls; a second click opens"),
];

const WORDS: [(&str, &str); 19] = [
    ("PID (NS)", "host pid (the pid inside its container)"),
    ("NVML USED", "the process's GPU memory, as NVML counts it"),
    ("FLOOR", "allocated at step boundaries: the leak signal"),
    ("PEAK", "highest allocated (torch's allocated peak)"),
    ("RESERVED", "held by PyTorch's caching allocator"),
    ("FRAG", "(reserved − allocated) / reserved"),
    ("OUTSIDE", "NVML used − reserved: memory outside PyTorch"),
    ("", "(CUDA context, NCCL); ? unknown: enter: why"),
    ("RETRY", "cudaMalloc retries after freeing the cache"),
    ("STEP", "the trainer's latest training step"),
    ("r0/8", "rank 0 of a run of 8 ranks (world size)"),
    ("FINDINGS", "leak, near (near the limit), frag, oom,"),
    ("", "crash, outside (memory outside PyTorch grows)"),
    ("-", "not reported: not a trainer, or not yet"),
    ("conns, lines", "trainer connections, lines received"),
    ("rejected", "lines, connections refused (bad, over limits)"),
    ("unsent", "replies to trainers the daemon could not send"),
    ("", "(trainer not reading); no trainer data is lost"),
    ("NVML UP/DOWN", "whether the GPU driver answers"),
];

/// The overlay's width: a key column of 16, its margins, and room for what it means.
pub const WIDTH: u16 = 66;
/// Characters a meaning may have without being cut at `WIDTH` (border, " key ", margin).
#[cfg(test)]
pub const MEANING: usize = WIDTH as usize - 2 - 18;

pub fn render(f: &mut Frame, area: Rect, page: usize, t: Theme) {
    let (title, rows) = PAGES[page.min(PAGES.len() - 1)];
    let w = WIDTH.min(area.width);
    let h = (rows.len() as u16 + 2).min(area.height);
    let r = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    let lines: Vec<Line> = rows
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!(" {k:<16} "), t.accent()),
                Span::raw(*what),
            ])
        })
        .collect();
    let close = if page + 1 < PAGES.len() {
        " ? columns and words · any other key closes "
    } else {
        " any key closes "
    };
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(
            Block::bordered()
                .title(Span::styled(title, t.bold()))
                .title_bottom(Line::styled(close, t.dim()).right_aligned()),
        ),
        r,
    );
}
