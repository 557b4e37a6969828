//! Human-readable units for tables and messages.

/// Bytes in binary units: "512 B", "1.5 KiB", "79.6 GiB".
pub fn bytes(b: u64) -> String {
    let (v, unit) = scaled(b);
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// As `bytes`, with two decimals under 10 of a unit ("4.75 GiB", as torch prints a cap): near a
/// small cap, 4.6 and 4.8 GiB hide the 110 MiB that matter.
pub fn bytes_fine(b: u64) -> String {
    match scaled(b) {
        (_, 0) => format!("{b} B"),
        (v, unit) if v < 9.995 => format!("{v:.2} {}", UNITS[unit]),
        (v, unit) => format!("{v:.1} {}", UNITS[unit]),
    }
}

/// A span to the second: "42s", "3m05s", "4h10m", "2d03h" (what a dashboard counts up).
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "?".into();
    }
    span(secs.round() as u64, true)
}

/// A span as a forecast or a message gives it: "45s", "12m", "4h10m", "2d03h" (seconds beyond
/// the first minute are noise there).
pub fn duration_coarse(secs: f64) -> String {
    if !secs.is_finite() {
        return "?".into();
    }
    span(secs.max(0.0).round() as u64, false)
}

fn span(s: u64, seconds: bool) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 if seconds => format!("{}m{:02}s", s / 60, s % 60),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// 31000 → "31,000".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

fn scaled(b: u64) -> (f64, usize) {
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    (v, unit)
}

/// `n/a` where NVML has no value.
pub fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "n/a".into())
}

#[cfg(test)]
mod tests;
