//! What `cache_growth` (the leak's test on the reserved floor) does differently.
//!
//! A caching allocator that keeps reserving while the tensors alive stay flat (torch issue
//! #123548: ~138 MiB a cycle with `max_split_size_mb` and `expandable_segments`) fills an 80 GB
//! device in a few hundred steps, so it cannot wait out the leak's warm-up. Its traps are the
//! cache's normal life: growth in the first steps that plateaus, a cache that steps up to the
//! longest batch of variable lengths and stops, an evaluation's one-time growth, CUDA graph
//! pools. None is a spread, sustained rise, which is what the leak's test asks for; the larger
//! materiality keeps a slow drift of fragmentation (a few % of the device) out.

use std::collections::VecDeque;

use super::super::stats::median;
use super::Seg;

/// Steps ignored at the start: the cache reaches the step peak within the first few steps, and
/// compile or DDP add their pools by step ~100. Short enough that a 138 MiB/step creep from
/// 2 GiB on an 80 GB device is confirmed (13 level-0 segments: 52 steps sampled every step,
/// 104 at one sample in 8) before reserved is at half the device (~280 steps).
pub const WARMUP_STEPS: u64 = 128;

/// The growth worth reporting, as a share of what the process can use: a cache is meant to
/// grow, and a few GiB more over a run (fragmentation drifting up) fill no device.
pub const MATERIALITY: f64 = 0.08;

/// The allocated floor may rise by at most this share of the reserved floor's rise over the
/// same window: more, and it is live memory growing (a `leak`), which reserved follows.
const ALLOCATED_SHARE: f64 = 0.25;

/// Segment to segment, at least this share of the window's reserved minima must rise: a creep
/// reserves a little more at every step, while CUDA graphs captured one after another during
/// warm-up, or a cache stepping up to new shapes, rise in a few stairs with flats between.
const RISING_SHARE: f64 = 0.5;

/// Whether a rising reserved floor is a creeping cache: it rose steadily, and the allocated floor
/// stayed flat.
pub fn creeps(done: &VecDeque<Seg>) -> bool {
    steady(done) && allocated_flat(done)
}

fn steady(done: &VecDeque<Seg>) -> bool {
    let pairs = done.len().saturating_sub(1);
    let rising = done
        .iter()
        .zip(done.iter().skip(1))
        .filter(|(a, b)| b.min > a.min)
        .count();
    pairs > 0 && rising as f64 >= RISING_SHARE * pairs as f64
}

/// Whether the allocated floor stayed flat while the reserved one rose: the rise of the median
/// of each third's minima, first to last, for both.
fn allocated_flat(done: &VecDeque<Seg>) -> bool {
    let n = done.len();
    let k = n / 3;
    if k == 0 {
        return false;
    }
    let rise = |f: fn(&Seg) -> f64| -> Option<f64> {
        let mut first: Vec<f64> = done.iter().take(k).map(f).collect();
        let mut last: Vec<f64> = done.iter().skip(n - k).map(f).collect();
        Some(median(&mut last)? - median(&mut first)?)
    };
    match (rise(|s| s.min), rise(|s| s.alloc_min)) {
        (Some(reserved), Some(allocated)) => {
            reserved > 0.0 && allocated <= ALLOCATED_SHARE * reserved
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
