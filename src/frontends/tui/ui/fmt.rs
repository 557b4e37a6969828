//! Small text formatters shared by the screens.

use crate::core::model::Timestamp;

pub use crate::units::{duration, thousands};

/// "4m10s ago", relative to the newest data time.
pub fn ago(now: Timestamp, ts: Timestamp) -> String {
    let d = now - ts;
    if d < 1.0 {
        "now".into()
    } else {
        format!("{} ago", duration(d))
    }
}

/// "1 trainer", "2 trainers".
pub fn plural(n: impl Into<u64>, what: &str) -> String {
    let n = n.into();
    match (n, what.ends_with('s')) {
        (1, _) => format!("1 {what}"),
        (_, true) => format!("{n} {what}es"),
        _ => format!("{n} {what}s"),
    }
}

/// Cells `s` takes on a terminal, as ratatui counts them (a CJK character two, a combining
/// mark none): what a column is measured in. Strings from a trainer or a daemon reach here
/// escaped (util::printable), so nothing in them draws as nothing or moves the cursor.
pub fn width(s: &str) -> usize {
    ratatui::text::Span::raw(s).width()
}

fn char_width(c: char) -> usize {
    let mut buf = [0; 4];
    width(c.encode_utf8(&mut buf))
}

/// `s` padded with spaces to `w` cells (as `{:<w$}` would pad to `w` characters).
pub fn pad(s: &str, w: usize) -> String {
    let n = width(s);
    format!("{s}{}", " ".repeat(w.saturating_sub(n)))
}

/// Cuts `s` to `max` cells, marking the cut with "…".
pub fn clip(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut left = max - 1;
    let mut t = String::new();
    for c in s.chars() {
        let w = char_width(c);
        if w > left {
            break;
        }
        left -= w;
        t.push(c);
    }
    t.push('…');
    t
}

/// Cuts `s` to `max` cells keeping its last "; " clause whole when that fits beside a
/// third of the room for the rest: a finding's last clause is what matters most (the run going
/// on, the time left), so the cut falls in the middle. Otherwise as `clip`; but a last clause
/// that names a line ("allocated at train.py:27 in kept_outputs") is never cut off: the head
/// gives way first, down to a few words, then the clause loses its start, never the place.
pub fn clip_keeping_last(s: &str, max: usize) -> String {
    // Fewer characters than this would say nothing ("allocated fl…").
    const FEW: usize = 16;
    if width(s) <= max {
        return s.to_string();
    }
    let Some((head, tail)) = s.rsplit_once("; ") else {
        return clip(s, max);
    };
    let named = names_a_line(tail);
    let head_min = if named { FEW } else { max / 3 };
    let tail_len = width(tail);
    if tail_len + 2 + head_min.min(width(head)) <= max {
        return format!("{}; {tail}", clip(head, max - tail_len - 2));
    }
    let head_room = max / 3;
    let tail_room = max.saturating_sub(head_room + 2);
    if !named || head_room < FEW / 2 || tail_room < FEW {
        return clip(s, max);
    }
    let tail = clip_start(tail, tail_room);
    format!("{}; {tail}", clip(head, max - width(&tail) - 2))
}

/// Whether `s` names a source line: a word such as "train.py:27".
fn names_a_line(s: &str) -> bool {
    s.split_whitespace().any(|w| {
        w.rsplit_once(':').is_some_and(|(file, line)| {
            file.contains('.') && !line.is_empty() && line.chars().all(|c| c.is_ascii_digit())
        })
    })
}

/// Cuts `s` to `max` cells from its start, at a word where one is near: "…at train.py:27".
fn clip_start(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    // The longest end of `s` that fits beside the "…".
    let mut left = max.saturating_sub(1);
    let mut cut = s.len();
    for (i, c) in s.char_indices().rev() {
        let w = char_width(c);
        if w > left {
            break;
        }
        left -= w;
        cut = i;
    }
    let end = &s[cut..];
    // Starting mid-word reads as a typo; the next word is close enough.
    let mid_word = s[..cut].chars().next_back().is_some_and(|c| c != ' ');
    let end = match end.split_once(' ') {
        Some((_, rest)) if mid_word && width(rest) * 2 >= max => rest,
        _ => end.trim_start(),
    };
    format!("…{end}")
}

#[cfg(test)]
mod tests;
