//! `oom`: the allocator's `num_ooms` rose, or the client's OOM observer sent an `oom` event.
//! Stays active for a while after the last one, so an OOM caught and retried by the trainer
//! (a smaller batch, a skipped step) is still visible. The evidence says how full the allocator
//! was against its cap when `set_per_process_memory_fraction` set one: the device's free memory
//! says nothing then (torch reports 74 GiB free to a process allowed 4.75 GiB).
//!
//! With the trainer's explanation (pattern, the line that asked, what held the memory) the
//! evidence carries it whole. A sample after the OOM means the trainer caught it and went on
//! (`survived`): batch-size search does this on purpose. Signals are sent only when something
//! changed, so a held OOM's explanation is not copied at every sample.

use super::explanation::Explanation;
use super::{cap, Detector, Evidence, Kind, Obs, Pos, Signal};
use crate::core::categories::{Budget, CategoryEvidence, Tracker};
use crate::core::trainer::EventKind;
use crate::core::trainer::EventRecord;

/// An OOM stays active until both this many steps and this many seconds have passed since the
/// last one: a count of samples would be seconds at 10 samples a second and hours on slow steps.
const HOLD_STEPS: u64 = 100;
const HOLD_SECS: f64 = 300.0;

pub struct Oom {
    last_total: u64,
    last_oom: Option<Pos>,
    last_step: Option<u64>,
    /// From the latest samples: what the allocator held and the device's size.
    reserved: Option<u64>,
    device_total: Option<u64>,
    /// Outside the allocator at the latest sample that could say.
    outside: Option<u64>,
    /// The session's splits as of the latest sample (copied only when a new one arrives), and
    /// that sample's limit, split blocks and world size: an `oom` event comes without them.
    split: Option<Tracker>,
    limits: (Budget, Option<u64>),
    evidence: Evidence,
    /// Whether the finding was told this evidence, and the activity it was told last.
    told: bool,
    told_active: bool,
}

impl Oom {
    pub fn new() -> Self {
        Self {
            last_total: 0,
            last_oom: None,
            last_step: None,
            reserved: None,
            device_total: None,
            outside: None,
            split: None,
            limits: (Budget::default(), None),
            evidence: Evidence::default(),
            told: true,
            told_active: false,
        }
    }

    fn active(&self, now: &Pos) -> bool {
        self.last_oom
            .is_some_and(|p| !p.reached(now, HOLD_STEPS, HOLD_SECS))
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
        let s = obs.sample;
        let now = obs.pos();
        self.last_step = s.step.or(self.last_step);
        self.reserved = s.stats.reserved.or(self.reserved);
        self.device_total = s.device_total.or(self.device_total);
        self.outside = obs.outside.or(self.outside);
        if let Some(t) = obs.categories {
            if self.split.as_ref().is_none_or(|k| k.measured != t.measured) {
                self.split = Some(t.clone());
            }
        }
        self.limits = (obs.budget(), obs.world_size);
        if obs.ooms_total > self.last_total {
            self.last_total = obs.ooms_total;
            self.last_oom = Some(now);
            // An `oom` event of the same OOM usually came first and says more (the size).
            if self.evidence.step.is_none() {
                self.evidence.step = s.step;
                self.evidence.device_free = s.device_free;
                self.evidence.reserved_bytes = s.stats.reserved;
                self.evidence.alloc_limit = obs.cap();
                self.evidence.outside_allocator_bytes = self.outside;
                self.evidence.categories = self.categories();
                self.told = false;
            } else {
                self.went_on(&now);
            }
        } else {
            // The sample that first shows an OOM in the counter was taken after it, but only a
            // further one says the run goes on; after an event, any sample does.
            self.went_on(&now);
        }
        let active = self.active(&now);
        if !active {
            self.evidence = Evidence::default();
        }
        if active == self.told_active && self.told {
            return None;
        }
        (self.told, self.told_active) = (true, active);
        Some(Signal {
            active,
            evidence: self.evidence.clone(),
        })
    }

    fn event(&mut self, e: &EventRecord, explanation: Option<&Explanation>) -> Option<Signal> {
        if e.kind != EventKind::Oom {
            return None;
        }
        self.last_oom = Some(Pos {
            step: self.last_step,
            ts: e.ts,
        });
        self.evidence = Evidence {
            alloc_bytes: e.alloc_bytes,
            device_free: e.device_free,
            reserved_bytes: self.reserved,
            alloc_limit: cap(e.alloc_limit, self.device_total),
            detail: e.detail.clone(),
            step: self.last_step,
            outside_allocator_bytes: self.outside,
            explanation: explanation.map(|x| Box::new(x.clone())),
            categories: self.categories(),
            ..Evidence::default()
        };
        (self.told, self.told_active) = (true, true);
        Some(Signal {
            active: true,
            evidence: self.evidence.clone(),
        })
    }
}

impl Oom {
    /// The split and its remedies against the latest sample's limit.
    fn categories(&self) -> Option<Box<CategoryEvidence>> {
        let (budget, world) = self.limits;
        self.split.as_ref()?.evidence(budget, world).map(Box::new)
    }

    /// A sample after the OOM: the trainer caught it and went on.
    fn went_on(&mut self, now: &Pos) {
        if self.evidence.survived.is_none() && self.active(now) {
            self.evidence.survived = Some(true);
            self.evidence.survived_step = now.step;
            self.told = false;
        }
    }
}

#[cfg(test)]
mod tests;
