//! `near_limit`: the caching allocator is at the edge. Either `num_alloc_retries` keeps rising
//! (a cudaMalloc failed, the allocator freed its cache and tried again: slow, and one step from
//! an OOM), or the headroom at the step peak (device free + reserved − peak) stays under the
//! configured margin.

use std::collections::VecDeque;

use super::{Detector, Evidence, Kind, Obs, Signal};

/// Samples the detector looks back over.
const WINDOW: usize = 100;
/// Retries within the window that count as rising (one could be a one-off).
const RETRIES: u64 = 2;
/// Of the last `TIGHT_WINDOW` samples, this many under the margin count as tight.
const TIGHT_WINDOW: usize = 20;
const TIGHT: usize = 10;

pub struct NearLimit {
    margin: u64,
    retries: VecDeque<u64>,
    tight: VecDeque<bool>,
}

impl NearLimit {
    pub fn new(margin_bytes: u64) -> Self {
        Self {
            margin: margin_bytes,
            retries: VecDeque::with_capacity(WINDOW + 1),
            tight: VecDeque::with_capacity(TIGHT_WINDOW + 1),
        }
    }
}

impl Detector for NearLimit {
    fn kind(&self) -> Kind {
        Kind::NearLimit
    }

    fn sample(&mut self, obs: &Obs) -> Option<Signal> {
        self.retries.push_back(obs.retries_total);
        if self.retries.len() > WINDOW {
            self.retries.pop_front();
        }
        let recent = obs.retries_total - self.retries.front().copied().unwrap_or(0);
        let st = &obs.sample.stats;
        let used = st.allocated_peak.max(st.allocated);
        let headroom = match (obs.limit(), used) {
            (Some(limit), Some(used)) => Some(limit as i64 - used as i64),
            _ => None,
        };
        self.tight
            .push_back(headroom.is_some_and(|h| h < self.margin as i64));
        if self.tight.len() > TIGHT_WINDOW {
            self.tight.pop_front();
        }
        let tight = self.tight.iter().filter(|t| **t).count() >= TIGHT;
        Some(Signal {
            active: recent >= RETRIES || tight,
            evidence: Evidence {
                retries: Some(recent),
                headroom_bytes: headroom,
                step: obs.sample.step,
                ..Evidence::default()
            },
        })
    }
}
