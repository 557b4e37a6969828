//! `near_limit`: the caching allocator is at the edge. Either `num_alloc_retries` keeps rising
//! (a cudaMalloc failed, the allocator freed its cache and tried again: slow, and one step from
//! an OOM), or the headroom at the step peak (what the allocator could hold, capped by
//! `set_per_process_memory_fraction`, minus the peak) stays under the configured margin. Under a
//! cap the margin is at most a tenth of the cap: 512 MiB is a quarter of a 2 GiB cap, and would
//! call a trainer using 75% of it near the limit.
//!
//! Windows are in steps and seconds (`window::Recent`), not samples: retries come in bursts
//! tens to hundreds of steps apart, and how many samples cover those steps depends on the
//! client's cadence. Holding the finding between bursts is the lifecycle's quiet period
//! (`session.rs`).

use super::window::Recent;
use super::{Detector, Evidence, Kind, Obs, Signal};
use crate::core::categories::near_limit_margin;

/// Retries are counted over the last `RETRY_STEPS` steps or `RETRY_SECS` seconds, whichever
/// reaches further back: bursts in the corpus and in real runs come 20–300 steps apart.
const RETRY_STEPS: u64 = 300;
const RETRY_SECS: f64 = 300.0;
/// Retries within the window that count as rising (one could be a one-off).
const RETRIES: u64 = 2;
/// Headroom is judged over the last `TIGHT_STEPS` steps or `TIGHT_SECS` seconds, and at least
/// the last `TIGHT_KEEP` samples, so one step with an unusual peak is not "tight" and sparse
/// samples still make a window.
const TIGHT_STEPS: u64 = 20;
const TIGHT_SECS: f64 = 10.0;
const TIGHT_KEEP: usize = 3;
/// Tight samples needed in that window: at least this many, and at least half of them.
const TIGHT_MIN: usize = 2;

pub struct NearLimit {
    margin: u64,
    last_total: Option<u64>,
    /// Retries seen, where they happened.
    retries: Recent<u64>,
    /// Whether each recent sample's headroom was under the margin.
    tight: Recent<bool>,
}

impl NearLimit {
    /// The margin for this sample: the configured one, or a tenth of the cap when that is less.
    fn margin(&self, obs: &Obs) -> u64 {
        near_limit_margin(self.margin, obs.cap())
    }

    pub fn new(margin_bytes: u64) -> Self {
        Self {
            margin: margin_bytes,
            last_total: None,
            retries: Recent::new(RETRY_STEPS, RETRY_SECS, 0),
            tight: Recent::new(TIGHT_STEPS, TIGHT_SECS, TIGHT_KEEP),
        }
    }
}

impl Detector for NearLimit {
    fn kind(&self) -> Kind {
        Kind::NearLimit
    }

    fn sample(&mut self, obs: &Obs) -> Option<Signal> {
        let at = obs.pos();
        // The first sample's counter is history from before the session (a client attached
        // mid-run): it may be hours old, so it is not "recent".
        let new = obs
            .retries_total
            .saturating_sub(self.last_total.unwrap_or(obs.retries_total));
        self.last_total = Some(obs.retries_total);
        if new > 0 {
            self.retries.push(at, new);
        } else {
            self.retries.forget(at);
        }
        let recent = self.retries.total();
        let st = &obs.sample.stats;
        let used = st.allocated_peak.max(st.allocated);
        let headroom = match (obs.limit(), used) {
            (Some(limit), Some(used)) => Some(limit as i64 - used as i64),
            _ => None,
        };
        if let Some(h) = headroom {
            let margin = i64::try_from(self.margin(obs)).unwrap_or(i64::MAX);
            self.tight.push(at, h < margin);
        }
        let tight_count = self.tight.total() as usize;
        let tight = tight_count >= TIGHT_MIN && 2 * tight_count >= self.tight.len();
        let active = recent >= RETRIES || tight;
        Some(Signal {
            active,
            evidence: Evidence {
                // Only while it holds: the split is cloned and the batch fitted per sample.
                categories: if active { obs.categories() } else { None },
                retries: Some(recent),
                headroom_bytes: headroom,
                alloc_limit: obs.cap(),
                outside_allocator_bytes: obs.outside,
                step: obs.sample.step,
                ..Evidence::default()
            },
        })
    }
}

#[cfg(test)]
mod tests;
