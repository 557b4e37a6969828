//! The memory gauge both GPU views draw: the overview's blocks and the one-line listing.

use ratatui::text::{Line, Span};

use super::theme::{Theme, FREE, RESERVED, USED};

/// Used, then reserved by the driver, then free, in proportion to the total.
pub(super) fn gauge(used: u64, reserved: u64, total: u64, width: u16, t: Theme) -> Line<'static> {
    let w = usize::from(width);
    let part = |b: u64| {
        if total == 0 {
            0
        } else {
            ((b as f64 / total as f64) * w as f64).round() as usize
        }
    };
    let res = if reserved > 0 {
        part(reserved).max(1)
    } else {
        0
    }
    .min(w);
    let used = part(used).min(w - res);
    let free = w - res - used;
    Line::from(vec![
        Span::styled(USED.repeat(used), t.used()),
        Span::styled(RESERVED.repeat(res), t.reserved()),
        Span::styled(FREE.repeat(free), t.free()),
    ])
}

#[cfg(test)]
mod tests;
