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

#[cfg(test)]
mod tests {
    use super::*;

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
