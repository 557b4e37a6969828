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
mod tests {
    use super::*;

    #[test]
    fn formats_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(85_520_809_984), "79.6 GiB");
        assert_eq!(opt(None::<u64>, bytes), "n/a");
        assert_eq!(bytes_fine(5_100_273_664), "4.75 GiB");
        assert_eq!(bytes_fine(402_653_184), "384.0 MiB");
        assert_eq!(bytes_fine(10_736_000_000), "10.0 GiB");
        assert_eq!(bytes_fine(1000), "1000 B");
    }
}
