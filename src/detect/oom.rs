//! `oom`: the allocator's `num_ooms` rose, or the client's OOM observer sent an `oom` event.
//! Stays active for a while after the last one, so an OOM caught and retried by the trainer
//! (a smaller batch, a skipped step) is still visible.

use super::{Detector, Evidence, Kind, Obs, Signal};
use crate::store::sessions::EventRecord;

/// Samples an OOM stays active for after the last one.
const HOLD: u32 = 100;

pub struct Oom {
    last_total: u64,
    since_last: Option<u32>,
    last_step: Option<u64>,
    evidence: Evidence,
}

impl Oom {
    pub fn new() -> Self {
        Self {
            last_total: 0,
            since_last: None,
            last_step: None,
            evidence: Evidence::default(),
        }
    }
}

impl Default for Oom {
    fn default() -> Self {
        Self::new()
    }
}

impl Detector for Oom {
    fn kind(&self) -> Kind {
        Kind::Oom
    }

    fn sample(&mut self, obs: &Obs) -> Option<Signal> {
        self.last_step = obs.sample.step.or(self.last_step);
        if obs.ooms_total > self.last_total {
            self.last_total = obs.ooms_total;
            self.since_last = Some(0);
            if self.evidence.step.is_none() {
                self.evidence.step = obs.sample.step;
                self.evidence.device_free = obs.sample.device_free;
            }
        } else if let Some(n) = self.since_last.as_mut() {
            *n += 1;
        }
        let active = self.since_last.is_some_and(|n| n < HOLD);
        if !active {
            self.evidence = Evidence::default();
        }
        Some(Signal {
            active,
            evidence: self.evidence.clone(),
        })
    }

    fn event(&mut self, e: &EventRecord) -> Option<Signal> {
        if e.kind != "oom" {
            return None;
        }
        self.since_last = Some(0);
        self.evidence = Evidence {
            alloc_bytes: e.alloc_bytes,
            device_free: e.device_free,
            detail: e.detail.clone(),
            step: self.last_step,
            ..Evidence::default()
        };
        Some(Signal {
            active: true,
            evidence: self.evidence.clone(),
        })
    }
}
