//! `leak`: the memory that survives each training step keeps growing.
//!
//! The signal is the per-step floor (`allocated_bytes.all.current` at step boundaries) of train
//! samples. It is summarised as segment minima at several time scales at once: level 0 holds
//! minima of 4 samples, level 1 of 8, and so on, each level keeping its last `KEEP` segments.
//! Minima ignore spikes, checkpoint saves and the peaks of an accumulation cycle; many scales let
//! a fast leak be seen within a few hundred steps and a slow one over tens of thousands, with
//! bounded memory (at most `LEVELS` × `KEEP` segments) and bounded work (a level is judged only
//! when it completes a segment, so the cost per sample is constant).
//!
//! A level's window of segment minima shows a leak when all of these hold:
//! - a Mann–Kendall test says it rises (tie-corrected, p < `P_MAX`);
//! - the rise is spread over the window: each third of it lies above the one before by a share of
//!   the whole rise, so a single level shift (warm-up, a curriculum switch) is not a leak;
//! - the Theil–Sen slope times the window's span is material: at least a share of the device;
//! - and it stays so while the window moves on by a third (`confirm` evaluations in a row), so
//!   a ramp that stops is not one either.

use std::collections::VecDeque;

use super::stats::{mann_kendall, median, theil_sen};
use super::{Detector, Evidence, Kind, Obs, Signal};

const L0: u32 = 4;
const LEVELS: usize = 14;
const KEEP: usize = 32;
const MIN_WINDOW: usize = 9;
const P_MAX: f64 = 1e-4;
/// Each third of the window must carry at least this share of its rise.
const SHARE: f64 = 0.2;
/// Train samples ignored at the start (optimizer state, workspaces, DDP buckets, compile: the
/// corpus has warm-ups that climb in stairs for a few hundred steps).
const WARMUP: u64 = 64;
const WARMUP_STEPS: u64 = 256;
const L0_STEPS: u64 = 16;
fn knob(name: &str, d: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}
/// Materiality when the device size is unknown.
const FALLBACK_MATERIAL: f64 = 512.0 * 1048576.0;
/// Never report growth smaller than this, whatever the device.
const MIN_MATERIAL: f64 = 64.0 * 1048576.0;

#[derive(Debug, Clone, Copy)]
struct Seg {
    first_step: u64,
    last_step: u64,
    t0: f64,
    t1: f64,
    min: f64,
    peak: u64,
    samples: u32,
    steps: u64,
}

impl Seg {
    fn merge(&mut self, o: &Seg) {
        self.last_step = o.last_step;
        self.t1 = o.t1;
        self.min = self.min.min(o.min);
        self.peak = self.peak.max(o.peak);
        self.samples += o.samples;
        self.steps += o.steps;
    }
}

#[derive(Debug, Clone, Copy)]
struct Verdict {
    p: f64,
    slope: f64,
    onset_step: u64,
    onset_floor: f64,
}

#[derive(Default)]
struct Level {
    cur: Option<Seg>,
    parts: u32,
    done: VecDeque<Seg>,
    streak: u32,
    last: Option<Verdict>,
}

impl Level {
    fn confirmed(&self) -> bool {
        let confirm = (self.done.len() / 3).max(2) as u32;
        self.last.is_some() && self.streak >= confirm
    }
}

pub struct Leak {
    materiality_ratio: f64,
    train_samples: u64,
    levels: Vec<Level>,
    /// What the process can use at most: the device, or the allocator's cap when lower.
    capacity: Option<u64>,
    /// That cap, when it binds (for the message).
    cap: Option<u64>,
    limit: Option<u64>,
    floor: f64,
    prev_step: Option<u64>,
}

impl Leak {
    pub fn new(materiality_ratio: f64) -> Self {
        Self {
            materiality_ratio,
            train_samples: 0,
            levels: Vec::new(),
            capacity: None,
            cap: None,
            limit: None,
            floor: 0.0,
            prev_step: None,
        }
    }

    /// Growth worth reporting: a share of what the process can use, so a leak under a small
    /// cap is material sooner than on the whole device.
    fn material(&self) -> f64 {
        match self.capacity {
            Some(t) => (t as f64 * self.materiality_ratio).max(MIN_MATERIAL),
            None => FALLBACK_MATERIAL,
        }
    }

    /// Feeds a finished segment into level `j`; returns whether any level was judged.
    fn push(&mut self, j: usize, seg: Seg) -> bool {
        if j >= LEVELS {
            return false;
        }
        if self.levels.len() <= j {
            self.levels.push(Level::default());
        }
        let need = if j == 0 { L0 } else { 2 };
        let lvl = &mut self.levels[j];
        match lvl.cur.as_mut() {
            Some(c) => c.merge(&seg),
            None => lvl.cur = Some(seg),
        }
        lvl.parts += 1;
        let covered = lvl.cur.map_or(0, |c| c.steps);
        if lvl.parts < need && !(j == 0 && covered >= knob("L0_STEPS", L0_STEPS)) {
            return false;
        }
        let Some(done) = lvl.cur.take() else {
            return false;
        };
        lvl.parts = 0;
        if lvl.done.len() == KEEP {
            lvl.done.pop_front();
        }
        lvl.done.push_back(done);
        let material = self.material();
        let verdict = judge(&self.levels[j].done, material);
        let lvl = &mut self.levels[j];
        match verdict {
            Some(v) => {
                lvl.streak = lvl.streak.saturating_add(1);
                lvl.last = Some(v);
            }
            None => {
                lvl.streak = 0;
                lvl.last = None;
            }
        }
        self.push(j + 1, done);
        true
    }

    fn signal(&self, step: u64) -> Signal {
        // The finest confirmed level has the most recent view of the slope.
        let Some((lvl, v)) = self
            .levels
            .iter()
            .filter(|l| l.confirmed())
            .find_map(|l| l.last.map(|v| (l, v)))
        else {
            return Signal {
                active: false,
                evidence: Evidence::default(),
            };
        };
        if std::env::var("LEAK_DEBUG").is_ok() {
            for (j, l) in self.levels.iter().enumerate() {
                eprintln!("L{j} n={} streak={} conf={} slope={:?}", l.done.len(), l.streak, l.confirmed(), l.last.map(|v| v.slope));
                for sg in &l.done { eprintln!("   {} {} {} {:.0} s{}", sg.first_step, sg.last_step, sg.steps, sg.min / 1048576.0, sg.samples); }
            }
        }
        let recent = &self.levels[0].done;
        let peak = recent.iter().map(|s| s.peak).max().unwrap_or(0);
        let (first, last) = (recent.front(), recent.back());
        let secs_per_step = match (first, last) {
            (Some(a), Some(b)) if b.last_step > a.first_step && b.t1 > a.t0 => {
                Some((b.t1 - a.t0) / (b.last_step - a.first_step) as f64)
            }
            _ => None,
        };
        // detection.md: OOM comes at the step peak, so steps ≈ (limit − recent peak) / slope.
        let eta_steps = self
            .limit
            .map(|limit| (limit.saturating_sub(peak) as f64 / v.slope).round() as u64);
        let slope = v.slope;
        let growth = (self.floor - v.onset_floor).max(0.0) as u64;
        let span = lvl
            .done
            .back()
            .map(|s| s.last_step.saturating_sub(v.onset_step))
            .unwrap_or(0);
        Signal {
            active: true,
            evidence: Evidence {
                slope_bytes_per_step: Some(slope),
                slope_bytes_per_second: secs_per_step.map(|s| slope / s),
                growth_bytes: Some(growth),
                confidence: Some(1.0 - v.p),
                onset_step: Some(v.onset_step),
                oom_eta_steps: eta_steps,
                oom_eta_seconds: eta_steps.zip(secs_per_step).map(|(n, s)| n as f64 * s),
                alloc_limit: self.cap,
                step: Some(step),
                detail: Some(format!("window of {span} steps")),
                ..Evidence::default()
            },
        }
    }
}

/// Judges one level's window; `Some` when it shows a material, sustained rise.
fn judge(done: &VecDeque<Seg>, material: f64) -> Option<Verdict> {
    let n = done.len();
    if n < MIN_WINDOW {
        return None;
    }
    let y: Vec<f64> = done.iter().map(|s| s.min).collect();
    let (_, p) = mann_kendall(&y);
    if p > P_MAX {
        return None;
    }
    let k = n / 3;
    let third = |r: std::ops::Range<usize>| median(&mut y[r].to_vec());
    let (a, b, c) = (third(0..k)?, third(k..n - k)?, third(n - k..n)?);
    let rise = c - a;
    if rise <= 0.0 || b - a < SHARE * rise || c - b < SHARE * rise {
        return None;
    }
    let x: Vec<f64> = done
        .iter()
        .map(|s| (s.first_step as f64 + s.last_step as f64) / 2.0)
        .collect();
    let slope = theil_sen(&x, &y)?;
    let span = x[n - 1] - x[0];
    if slope <= 0.0 || slope * span < material {
        return None;
    }
    let first = done.front()?;
    Some(Verdict {
        p,
        slope,
        onset_step: first.first_step,
        onset_floor: a,
    })
}

impl Detector for Leak {
    fn kind(&self) -> Kind {
        Kind::Leak
    }

    fn sample(&mut self, obs: &Obs) -> Option<Signal> {
        let s = obs.sample;
        if let Some(c) = obs.capacity() {
            self.capacity = Some(c);
            self.cap = obs.cap();
        }
        // The limit is capped too: the forecast is to the cap, where the OOM will come.
        if let Some(l) = obs.limit() {
            self.limit = Some(l);
        }
        if s.phase != "train" {
            return None;
        }
        let floor = s.stats.allocated?;
        self.train_samples += 1;
        let step = s.step.unwrap_or(self.train_samples);
        let covered = self.prev_step.map_or(1, |p| step.saturating_sub(p).max(1));
        self.prev_step = Some(step);
        if self.train_samples <= knob("WARMUP", WARMUP) && step <= knob("WARMUP_STEPS", WARMUP_STEPS) {
            return None;
        }
        self.floor = floor as f64;
        let seg = Seg {
            first_step: step,
            last_step: step,
            t0: s.ts,
            t1: s.ts,
            min: floor as f64,
            peak: s.stats.allocated_peak.unwrap_or(floor).max(floor),
            samples: 1,
            steps: covered,
        };
        if self.push(0, seg) {
            Some(self.signal(step))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests;
