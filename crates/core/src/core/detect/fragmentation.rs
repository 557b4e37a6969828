//! `fragmentation`: the caching allocator holds memory it cannot use while it is nearly out of
//! room: the device is nearly full, or the process is near its cap
//! (`set_per_process_memory_fraction`). Measured at the step peak (reserved − peak allocated),
//! since at a step boundary the cache legitimately holds the activations just freed;
//! `inactive_split` when no peak is sent.

use super::{Detector, Evidence, Kind, Obs, Signal};

/// Share of reserved memory unusable at the peak that counts as fragmented.
const RATIO: f64 = 0.2;
/// Below this much reserved memory, fragmentation does not matter.
const MIN_RESERVED: u64 = 1 << 30;
/// Nearly full: what the allocator could still take is under this share of what the process can
/// use (the device, or the cap when lower).
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
        let (ratio, unusable) = s.stats.fragmentation_at_peak()?;
        let full = match (obs.room(), obs.capacity()) {
            (Some(room), Some(cap)) if cap > 0 => (room as f64) < FULL * cap as f64,
            _ => false,
        };
        Some(Signal {
            active: full && reserved >= MIN_RESERVED && ratio >= RATIO,
            evidence: Evidence {
                ratio: Some(ratio),
                fragmented_bytes: Some(unusable),
                device_free: s.device_free,
                alloc_limit: obs.cap(),
                step: s.step,
                ..Evidence::default()
            },
        })
    }
}

#[cfg(test)]
mod tests;
