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

/// Cuts `s` to `max` characters, marking the cut with "…".
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut t: String = s.chars().take(max - 1).collect();
    t.push('…');
    t
}

/// Cuts `s` to `max` characters keeping its last "; " clause whole when that fits beside a
/// third of the room for the rest: a finding's last clause is what matters most (the run going
/// on, the time left), so the cut falls in the middle. Otherwise as `clip`; but a last clause
/// that names a line ("allocated at train.py:27 in kept_outputs") is never cut off: the head
/// gives way first, down to a few words, then the clause loses its start, never the place.
pub fn clip_keeping_last(s: &str, max: usize) -> String {
    // Fewer characters than this would say nothing ("allocated fl…").
    const FEW: usize = 16;
    if s.chars().count() <= max {
        return s.to_string();
    }
    let Some((head, tail)) = s.rsplit_once("; ") else {
        return clip(s, max);
    };
    let named = names_a_line(tail);
    let head_min = if named { FEW } else { max / 3 };
    let tail_len = tail.chars().count();
    if tail_len + 2 + head_min.min(head.chars().count()) <= max {
        return format!("{}; {tail}", clip(head, max - tail_len - 2));
    }
    let head_room = max / 3;
    let tail_room = max.saturating_sub(head_room + 2);
    if !named || head_room < FEW / 2 || tail_room < FEW {
        return clip(s, max);
    }
    let tail = clip_start(tail, tail_room);
    format!("{}; {tail}", clip(head, max - tail.chars().count() - 2))
}

/// Whether `s` names a source line: a word such as "train.py:27".
fn names_a_line(s: &str) -> bool {
    s.split_whitespace().any(|w| {
        w.rsplit_once(':').is_some_and(|(file, line)| {
            file.contains('.') && !line.is_empty() && line.chars().all(|c| c.is_ascii_digit())
        })
    })
}

/// Cuts `s` to `max` characters from its start, at a word where one is near: "…at train.py:27".
fn clip_start(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let cut = n + 1 - max;
    let end: String = s.chars().skip(cut).collect();
    // Starting mid-word reads as a typo; the next word is close enough.
    let mid_word = s.chars().nth(cut - 1).is_some_and(|c| c != ' ');
    let end = match end.split_once(' ') {
        Some((_, rest)) if mid_word && rest.chars().count() * 2 >= max => rest,
        _ => end.trim_start(),
    };
    format!("…{end}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_keeps_its_last_clause() {
        let m = "allocated floor grows 8.0 MiB/step since step 256 (+3.8 GiB so far); 98% of the growth in steps 337-357 was allocated at train.py:27 in kept_outputs";
        let c = clip_keeping_last(m, 140);
        assert_eq!(c.chars().count(), 140);
        assert!(
            c.ends_with(
                "; 98% of the growth in steps 337-357 was allocated at train.py:27 in kept_outputs"
            ),
            "{c}"
        );
        assert!(
            c.starts_with("allocated floor grows 8.0 MiB/step since step 256"),
            "{c}"
        );
        assert!(c.contains("…; 98% of the growth"), "{c}");
        // The head gives way before the clause does: at 114, a few of its words are left.
        let c = clip_keeping_last(m, 114);
        assert!(
            c.starts_with("allocated floor grows 8.0 MiB/")
                && c.ends_with("…; 98% of the growth in steps 337-357 was allocated at train.py:27 in kept_outputs"),
            "{c}"
        );
        // Narrower than the clause: its start goes, the place it names stays.
        let c = clip_keeping_last(m, 74);
        assert_eq!(c.chars().count(), 74, "{c}");
        assert!(c.starts_with("allocated floor grows 8.0 …; …was"), "{c}");
        assert!(c.ends_with(" at train.py:27 in kept_outputs"), "{c}");
        // Too narrow for any of that: cut at the end, as before.
        assert_eq!(clip_keeping_last(m, 20), clip(m, 20));
        // A last clause that names no line keeps its place only beside a third of the room.
        let eta = "allocated floor grows 2.0 MiB/step since step 610; at this rate the GPU is full in ~4h10m (step ~31,000)";
        assert_eq!(clip_keeping_last(eta, 74), clip(eta, 74));
        assert!(clip_keeping_last(eta, 90)
            .ends_with("…; at this rate the GPU is full in ~4h10m (step ~31,000)"));
        assert_eq!(clip_keeping_last("short", 20), "short");
    }

    #[test]
    fn formats() {
        assert_eq!(duration(42.0), "42s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(15_000.0), "4h10m");
        assert_eq!(duration(200_000.0), "2d07h");
        assert_eq!(duration(-1.0), "?");
        assert_eq!(thousands(31_000), "31,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("abc", 4), "abc");
        assert_eq!(ago(100.0, 99.5), "now");
        assert_eq!(plural(1u64, "process"), "1 process");
        assert_eq!(plural(2u64, "process"), "2 processes");
        assert_eq!(plural(0u64, "GPU"), "0 GPUs");
    }
}
