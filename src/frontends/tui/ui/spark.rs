//! Memory history as sparklines: time buckets, and the range a sparkline spans.

use crate::core::model::Timestamp;
use crate::frontends::tui::app::state::HISTORY_SECS;
use crate::units::bytes;

/// The range a sparkline spans: the window's own, so a climb is visible, but never narrower than
/// 2% of the GPU, so noise does not look like a cliff; the lowest value keeps a visible bar.
pub fn spark_range(data: &[Option<u64>], total: u64) -> Option<(u64, u64)> {
    let lo = data.iter().flatten().min().copied()?;
    let hi = data.iter().flatten().max().copied()?;
    let span = (hi - lo).max(total / 50).max(1);
    Some((hi.saturating_sub(span + span / 4), hi))
}

/// Splits the last `HISTORY_SECS` into at most `width` buckets of at least a second.
pub fn buckets(
    points: impl Iterator<Item = (Timestamp, Option<u64>)>,
    now: Timestamp,
    width: usize,
) -> Vec<Option<u64>> {
    if width == 0 {
        return Vec::new();
    }
    let span = (HISTORY_SECS / width as f64).max(1.0);
    let start = now - span * width as f64;
    let mut out: Vec<Option<Option<u64>>> = vec![None; width];
    let mut first = width;
    for (ts, v) in points {
        if ts <= start {
            continue;
        }
        let i = (((ts - start) / span).ceil() as usize)
            .saturating_sub(1)
            .min(width - 1);
        first = first.min(i);
        out[i] = Some(match (out[i].flatten(), v) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        });
    }
    // A bucket no poll fell into (timer jitter) repeats its neighbour; only real gaps show.
    let mut last = None;
    out.into_iter()
        .skip(first)
        .map(|b| {
            let v = b.unwrap_or(last);
            last = v;
            v
        })
        .collect()
}

/// Bytes without the space and with one letter: "21.0G", for tight columns.
pub fn short(b: u64) -> String {
    bytes(b)
        .replace(" GiB", "G")
        .replace(" MiB", "M")
        .replace(" KiB", "K")
        .replace(" TiB", "T")
}

pub fn bar(v: Option<u64>, lo: u64, hi: u64) -> char {
    const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    match v {
        None => '·',
        Some(v) => {
            let x = v.saturating_sub(lo) as f64 / (hi - lo).max(1) as f64;
            BARS[(x * 8.0).round().clamp(1.0, 8.0) as usize]
        }
    }
}

#[cfg(test)]
mod tests;
