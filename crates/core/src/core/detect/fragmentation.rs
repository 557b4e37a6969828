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
mod tests {
    use super::*;
    use crate::core::trainer::{Sample, Stats};

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const TOTAL: u64 = 85_520_809_984;

    /// 4.5 GiB reserved, 1.5 GiB of it unusable at the peak, 74 GiB of the device free.
    fn fragmented() -> Sample {
        Sample {
            ts: 1_763_700_000.0,
            step: Some(10),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(2 * GIB),
                allocated_peak: Some(3 * GIB),
                reserved: Some(4 * GIB + 512 * MIB),
                ..Stats::default()
            },
            device_free: Some(74 * GIB),
            device_total: Some(TOTAL),
            alloc_limit: None,
        }
    }

    fn active(cap: Option<u64>) -> Option<Signal> {
        let s = fragmented();
        let obs = Obs {
            sample: &s,
            retries_total: 0,
            ooms_total: 0,
            alloc_limit: cap,
            outside: None,
        };
        Fragmentation::new().sample(&obs)
    }

    #[test]
    fn full_means_near_the_cap_when_there_is_one() {
        // 74 GiB free on the device: not full, not worth a finding.
        assert!(!active(None).unwrap().active);
        // Capped at 4.75 GiB: 256 MiB left, under 10% of the cap.
        let sig = active(Some(4 * GIB + 768 * MIB)).unwrap();
        assert!(sig.active);
        assert_eq!(sig.evidence.alloc_limit, Some(4 * GIB + 768 * MIB));
        let m = crate::core::detect::message::describe(Kind::Fragmentation, &sig.evidence);
        assert!(
            m.ends_with("while the process is near the 4.75 GiB allowed"),
            "{m}"
        );
        // A cap with room to spare is not full either.
        assert!(!active(Some(8 * GIB)).unwrap().active);
    }
}
