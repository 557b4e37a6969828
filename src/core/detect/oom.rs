//! `oom`: the allocator's `num_ooms` rose, or the client's OOM observer sent an `oom` event.
//! Stays active for a while after the last one, so an OOM caught and retried by the trainer
//! (a smaller batch, a skipped step) is still visible. The evidence says how full the allocator
//! was against its cap when `set_per_process_memory_fraction` set one: the device's free memory
//! says nothing then (torch reports 74 GiB free to a process allowed 4.75 GiB).

use super::{cap, Detector, Evidence, Kind, Obs, Pos, Signal};
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
    evidence: Evidence,
}

impl Oom {
    pub fn new() -> Self {
        Self {
            last_total: 0,
            last_oom: None,
            last_step: None,
            reserved: None,
            device_total: None,
            evidence: Evidence::default(),
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
        if obs.ooms_total > self.last_total {
            self.last_total = obs.ooms_total;
            self.last_oom = Some(now);
            // An `oom` event of the same OOM usually came first and says more (the size).
            if self.evidence.step.is_none() {
                self.evidence.step = s.step;
                self.evidence.device_free = s.device_free;
                self.evidence.reserved_bytes = s.stats.reserved;
                self.evidence.alloc_limit = obs.cap();
            }
        }
        let active = self.active(&now);
        if !active {
            self.evidence = Evidence::default();
        }
        Some(Signal {
            active,
            evidence: self.evidence.clone(),
        })
    }

    fn event(&mut self, e: &EventRecord) -> Option<Signal> {
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
            ..Evidence::default()
        };
        Some(Signal {
            active: true,
            evidence: self.evidence.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::detect::message;
    use crate::core::trainer::{Sample, Stats};

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const TOTAL: u64 = 85_520_809_984;
    const CAP: u64 = 4 * GIB + 768 * MIB;

    fn sample(step: u64, ts: f64, ooms: u64) -> Sample {
        Sample {
            ts,
            step: Some(step),
            phase: "train".into(),
            stats: Stats {
                reserved: Some(4 * GIB + 655 * MIB),
                ooms: Some(ooms),
                ..Stats::default()
            },
            device_free: Some(74 * GIB),
            device_total: Some(TOTAL),
            alloc_limit: None,
        }
    }

    fn feed(d: &mut Oom, s: &Sample, cap: Option<u64>) -> Signal {
        let obs = Obs {
            sample: s,
            retries_total: 0,
            ooms_total: s.stats.ooms.unwrap_or(0),
            alloc_limit: cap,
        };
        d.sample(&obs).unwrap()
    }

    fn oom_event(ts: f64, alloc_limit: Option<u64>) -> EventRecord {
        EventRecord {
            ts,
            kind: "oom".into(),
            detail: None,
            alloc_bytes: Some(384 * MIB),
            device_free: Some(74 * GIB),
            alloc_limit,
        }
    }

    #[test]
    fn an_oom_under_a_cap_names_the_cap_not_the_free_device() {
        let mut d = Oom::new();
        feed(&mut d, &sample(1200, 100.0, 0), Some(CAP));
        let sig = d.event(&oom_event(100.5, Some(CAP))).unwrap();
        let m = message::describe(Kind::Oom, &sig.evidence);
        assert_eq!(
            m,
            "CUDA out of memory: tried to allocate 384.0 MiB with 4.64 GiB of the 4.75 GiB allowed already reserved at step 1,200"
        );
        assert!(message::hint(Kind::Oom, &sig.evidence)
            .unwrap()
            .contains("set_per_process_memory_fraction"));
    }

    #[test]
    fn without_a_cap_the_message_is_unchanged() {
        let mut d = Oom::new();
        feed(&mut d, &sample(1200, 100.0, 0), None);
        // torch's observer reports the device total as the limit when no fraction is set.
        let sig = d.event(&oom_event(100.5, Some(TOTAL))).unwrap();
        assert_eq!(sig.evidence.alloc_limit, None);
        assert_eq!(
            message::describe(Kind::Oom, &sig.evidence),
            "CUDA out of memory: tried to allocate 384.0 MiB with 74.0 GiB free at step 1,200"
        );
    }

    #[test]
    fn an_oom_seen_only_in_the_counter_names_the_cap_too() {
        let mut d = Oom::new();
        feed(&mut d, &sample(10, 100.0, 0), Some(CAP));
        let sig = feed(&mut d, &sample(11, 101.0, 1), Some(CAP));
        assert!(sig.active);
        assert_eq!(
            message::describe(Kind::Oom, &sig.evidence),
            "CUDA out of memory with 4.64 GiB of the 4.75 GiB allowed already reserved at step 11"
        );
    }

    /// Held for 100 steps and 5 minutes, however many samples that is.
    #[test]
    fn an_oom_is_held_in_steps_and_seconds() {
        let mut d = Oom::new();
        feed(&mut d, &sample(1, 0.0, 0), None);
        d.event(&oom_event(0.5, None));
        // Dense: 10 samples a second, 1,000 samples in 100 s: still held.
        for i in 1..=1000u64 {
            assert!(feed(&mut d, &sample(i, i as f64 / 10.0, 1), None).active);
        }
        assert!(!feed(&mut d, &sample(3000, 300.6, 1), None).active);
        // Sparse: a sample every 50 steps of 6 s. The counter shows the OOM at step 51; two
        // samples later (100 steps, 600 s) it is over.
        let mut d = Oom::new();
        feed(&mut d, &sample(1, 0.0, 0), None);
        d.event(&oom_event(0.5, None));
        assert!(feed(&mut d, &sample(51, 300.0, 1), None).active);
        assert!(feed(&mut d, &sample(101, 600.0, 1), None).active);
        assert!(!feed(&mut d, &sample(151, 900.0, 1), None).active);
    }
}
