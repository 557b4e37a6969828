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
/// third of the room for the rest: a finding's last clause is what matters most (the line that
/// allocated the leak, the run going on), so the cut falls in the middle. Otherwise as `clip`.
pub fn clip_keeping_last(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    // The head keeps at least a third of the room, or it would say nothing ("allocated fl…").
    match s.rsplit_once("; ") {
        Some((head, tail)) if tail.chars().count() + 2 + max / 3 <= max => {
            let room = max - tail.chars().count() - 2;
            format!("{}; {tail}", clip(head, room))
        }
        _ => clip(s, max),
    }
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
        // Where the rest would keep under a third of the room, cut at the end, as before.
        assert_eq!(clip_keeping_last(m, 110), clip(m, 110));
        // Too narrow for the clause: cut at the end, as before.
        assert_eq!(clip_keeping_last(m, 20), clip(m, 20));
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
