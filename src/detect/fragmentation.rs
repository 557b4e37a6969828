//! `fragmentation`: the caching allocator holds memory it cannot use while the device is nearly
//! full. Measured at the step peak (reserved − peak allocated), since at a step boundary the
//! cache legitimately holds the activations just freed; `inactive_split` when no peak is sent.

use super::{Detector, Evidence, Kind, Obs, Signal};

/// Share of reserved memory unusable at the peak that counts as fragmented.
const RATIO: f64 = 0.2;
/// Below this much reserved memory, fragmentation does not matter.
const MIN_RESERVED: u64 = 1 << 30;
/// The device counts as nearly full under this share free.
const FULL: f64 = 0.1;

pub struct Fragmentation;

impl Fragmentation {
    pub fn new() -> Self {
        Self
    }
}

impl Default for Fragmentation {
    fn default() -> Self {
        Self::new()
    }
}

impl Detector for Fragmentation {
    fn kind(&self) -> Kind {
        Kind::Fragmentation
    }

    fn sample(&mut self, obs: &Obs) -> Option<Signal> {
        let s = obs.sample;
        let reserved = s.stats.reserved?;
        let unusable = match (s.stats.allocated_peak, s.stats.inactive_split) {
            (Some(peak), _) => reserved.saturating_sub(peak),
            (None, Some(split)) => split,
            (None, None) => return None,
        };
        let ratio = if reserved > 0 {
            unusable as f64 / reserved as f64
        } else {
            0.0
        };
        let full = match (s.device_free, s.device_total) {
            (Some(f), Some(t)) if t > 0 => (f as f64) < FULL * t as f64,
            _ => false,
        };
        Some(Signal {
            active: full && reserved >= MIN_RESERVED && ratio >= RATIO,
            evidence: Evidence {
                ratio: Some(ratio),
                fragmented_bytes: Some(unusable),
                device_free: s.device_free,
                step: s.step,
                ..Evidence::default()
            },
        })
    }
}
