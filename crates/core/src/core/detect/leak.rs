//! `leak`: the memory that survives each training step keeps growing. The same test, on the
//! process's memory outside the caching allocator at step boundaries (NVML's figure minus
//! reserved), is `untracked_growth`: NCCL communicators made per step, workspaces, raw
//! cudaMalloc. Its traps (the CUDA context at the first step, NCCL's warm-up, a one-time
//! workspace) are the leak's: a warm-up, and a single level shift that is no spread rise.
//! On the reserved floor (`reserved_bytes.all.current`), with the allocated floor flat over the
//! same window, it is `cache_growth`: PyTorch's caching allocator reserving memory it never
//! reuses nor gives back (cache.rs says what differs).
//!
//! The signal is the per-step floor (`allocated_bytes.all.current` at step boundaries) of train
//! samples. It is summarised as segment minima at several time scales at once: a level-0 segment
//! holds 4 samples, or fewer when they already stand for `L0_STEPS` steps (a client sampling
//! every few steps), a level-1 segment two level-0 ones, and so on, each level keeping its last
//! `KEEP` segments. Minima ignore spikes, checkpoint saves and the peaks of an accumulation
//! cycle; many scales let a fast leak be seen within a few hundred steps and a slow one over
//! tens of thousands, with bounded memory (at most `LEVELS` × `KEEP` segments) and bounded work
//! (a level is judged only when it completes a segment, so the cost per sample is constant).
//!
//! Time is counted in steps where it matters, not in samples: the client samples every step
//! only when steps are fast, and one step in 8 on typical 0.2–2 s steps. Counted in samples, the
//! warm-up and the segments would stretch with the cadence, and a fast leak would be past its
//! growth budget before the first window could even fill.
//!
//! A level's window of segment minima shows a leak when all of these hold:
//! - a Mann–Kendall test says it rises (tie-corrected, p < `P_MAX`);
//! - the rise is spread over the window: each third of it lies above the one before by a share of
//!   the whole rise, so a single level shift (warm-up, a curriculum switch) is not a leak;
//! - the Theil–Sen slope times the window's span is material: at least a share of the device;
//! - and it stays so while the window moves on by a third (`confirm` evaluations in a row), so
//!   a ramp that stops is not one either.
//!
//! The rate reported, and the OOM forecast made from it, is the slope of the lower envelope of
//! that window's minima (`stats::lower_envelope_slope`): what a step leaves allocated is the
//! floor plus whatever happens to be alive at the boundary, never less, so the floor runs along
//! the bottom of the scatter, not through its middle. With one sample per 8 steps the finest
//! segments hold one or two samples, and a Theil–Sen line through their minima, still a fine
//! test of "is it rising", can be off by a quarter on a noisy floor.
//!
//! How big the leak is, though, is measured from its onset, not over the window: the window
//! slides on (level 0's spans about 128 steps), and the growth over it says little of a leak
//! that has been firing for 20,000 steps. The onset is fixed when the detector first reports a
//! leak: the start of the window that showed it, and the floor there (`floor_of` its first
//! third). Growth is the floor now (`Leak::floor_now`) minus that floor. The onset is kept while
//! the leak stays active and forgotten after `QUIET_EVALUATIONS` evaluations in a row without
//! one, when the session resolves the finding. Both floors lean low where the data is ambiguous
//! (a dip, a stair just climbed), so the growth reported errs on the small side.

use std::collections::VecDeque;

mod cache;

use super::stats::{lower_envelope_slope, median, theil_sen, RunningMk};
use super::{Detector, Evidence, Kind, Obs, Signal};

/// Samples in a level-0 segment, at most...
const L0: u32 = 4;
/// ...and the steps after which it closes with fewer, so that level k spans about 8·2^k steps
/// whatever the cadence: 4 samples sampled every 2 steps, 1 sampled every 8. The first verdict
/// needs 13 segments: counted in samples alone that was 416 steps at one sample per 8 steps,
/// longer than a 6 MiB/step leak takes to use up its growth budget.
const L0_STEPS: u64 = 8;
const LEVELS: usize = 14;
const KEEP: usize = 32;
const MIN_WINDOW: usize = 9;
const P_MAX: f64 = 1e-4;
/// Each third of the window must carry at least this share of its rise.
const SHARE: f64 = 0.2;
/// Steps ignored at the start of a session, counted from its first train sample (a resumed run
/// starts at a high step): optimizer state, workspaces, DDP buckets and compile make the floor
/// climb in stairs for the first few hundred steps. Counted in samples it would last 64 steps
/// for a trainer sampled every step (where the later stairs look like a leak) and 512 for one
/// sampled every 8 (where a 3 MiB/step leak from step 150 is past its growth budget before the
/// first window can confirm it).
const WARMUP_STEPS: u64 = 256;
/// Materiality when the device size is unknown.
const FALLBACK_MATERIAL: f64 = 512.0 * 1048576.0;
/// Never report growth smaller than this, whatever the device.
const MIN_MATERIAL: f64 = 64.0 * 1048576.0;
/// Level-0 segments the current floor is read from (48 to 96 steps): enough to hold samples at
/// the floor itself where one in 8 is (under gradient accumulation), and few, because a stair of
/// a staircase leak counts in full only once it is older than that.
const FLOOR_SEGS: usize = 12;
/// Evaluations in a row without a confirmed rise after which the leak is over and its onset is
/// forgotten: the session clears a leak finding after as many, so a leak that comes back is a
/// new finding with a new onset, and one that only pauses for an evaluation or two keeps its.
pub const QUIET_EVALUATIONS: u32 = 3;

#[derive(Debug, Clone, Copy)]
struct Seg {
    first_step: u64,
    last_step: u64,
    t0: f64,
    t1: f64,
    min: f64,
    /// The step of that minimum: where the floor was seen, for the envelope.
    min_step: u64,
    /// `cache_growth`: the allocated minimum over the same samples (0 for the other floors).
    alloc_min: f64,
    peak: u64,
    /// Steps the segment stands for: from the train sample before its first one to its last.
    steps: u64,
}

impl Seg {
    fn merge(&mut self, o: &Seg) {
        self.last_step = o.last_step;
        self.t1 = o.t1;
        if o.min < self.min {
            self.min = o.min;
            self.min_step = o.min_step;
        }
        self.alloc_min = self.alloc_min.min(o.alloc_min);
        self.peak = self.peak.max(o.peak);
        self.steps = self.steps.saturating_add(o.steps);
    }
}

#[derive(Debug, Clone, Copy)]
struct Verdict {
    p: f64,
    slope: f64,
    /// Where the window starts, and the floor there (`start_floor`).
    start_step: u64,
    start_floor: f64,
}

/// Where a leak began, as first seen: fixed while it stays active.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Onset {
    step: u64,
    floor: f64,
}

#[derive(Default)]
struct Level {
    cur: Option<Seg>,
    parts: u32,
    done: VecDeque<Seg>,
    /// Mann–Kendall over `done`'s minima, kept as segments come and go.
    trend: RunningMk,
    streak: u32,
    last: Option<Verdict>,
}

impl Level {
    fn confirmed(&self) -> bool {
        let confirm = (self.done.len() / 3).max(2) as u32;
        self.last.is_some() && self.streak >= confirm
    }
}

/// Which floor a detector follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    /// `allocated_bytes.all.current`: live tensors (`leak`).
    Allocated,
    /// NVML's figure minus reserved (`untracked_growth`).
    Outside,
    /// `reserved_bytes.all.current`, while allocated stays flat (`cache_growth`).
    Reserved,
}

pub struct Leak {
    floor: Floor,
    materiality_ratio: f64,
    train_samples: u64,
    levels: Vec<Level>,
    /// What the process can use at most: the device, or the allocator's cap when lower.
    capacity: Option<u64>,
    /// That cap, when it binds (for the message).
    cap: Option<u64>,
    limit: Option<u64>,
    /// The current leak's onset, while there is one.
    onset: Option<Onset>,
    /// Evaluations in a row without a confirmed rise.
    quiet: u32,
    /// Step of the previous train sample, warm-up included: how many steps a sample stands for.
    prev_step: Option<u64>,
    /// Step of the first train sample: the warm-up is counted from there.
    first_step: Option<u64>,
    warmed_up: bool,
    /// The latest floor value seen (for `untracked_growth`'s "outside now").
    last: f64,
    /// `cache_growth`: the latest allocated figure, and the allocator settings the hello sent.
    last_alloc: Option<u64>,
    alloc_conf: Option<String>,
}

impl Leak {
    pub fn new(materiality_ratio: f64) -> Self {
        Self::of(Floor::Allocated, materiality_ratio)
    }

    /// The detector of growth outside the caching allocator.
    pub fn outside(materiality_ratio: f64) -> Self {
        Self::of(Floor::Outside, materiality_ratio)
    }

    /// The detector of a caching allocator that keeps reserving while allocated stays flat.
    pub fn cache(materiality_ratio: f64) -> Self {
        Self::of(Floor::Reserved, materiality_ratio.max(cache::MATERIALITY))
    }

    fn of(floor: Floor, materiality_ratio: f64) -> Self {
        Self {
            floor,
            materiality_ratio,
            train_samples: 0,
            levels: Vec::new(),
            capacity: None,
            cap: None,
            limit: None,
            onset: None,
            quiet: 0,
            prev_step: None,
            first_step: None,
            warmed_up: false,
            last: 0.0,
            last_alloc: None,
            alloc_conf: None,
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
        let lvl = &mut self.levels[j];
        let cur = match lvl.cur.as_mut() {
            Some(c) => {
                c.merge(&seg);
                c
            }
            None => lvl.cur.insert(seg),
        };
        lvl.parts += 1;
        let full = if j == 0 {
            lvl.parts >= L0 || cur.steps >= L0_STEPS
        } else {
            lvl.parts >= 2
        };
        if !full {
            return false;
        }
        let Some(done) = lvl.cur.take() else {
            return false;
        };
        lvl.parts = 0;
        if lvl.done.len() == KEEP {
            if let Some(old) = lvl.done.pop_front() {
                lvl.trend.remove(lvl.done.iter().map(|s| s.min), old.min);
            }
        }
        lvl.trend.add(lvl.done.iter().map(|s| s.min), done.min);
        lvl.done.push_back(done);
        let material = self.material();
        let verdict = judge(&self.levels[j].done, self.levels[j].trend, material)
            .filter(|_| self.floor != Floor::Reserved || cache::creeps(&self.levels[j].done));
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

    /// The floor now: the lowest of the last `FLOOR_SEGS` level-0 minima, each carried forward
    /// to `step` along the floor's `slope` (so a steady leak is not read late). Not the last
    /// sample: it holds whatever was alive at that boundary, up to GiBs above the floor under an
    /// accumulation sawtooth, where the client may see the floor itself once in 8 samples. A
    /// dip under the floor, or a stair climbed within those segments, reads low, never high.
    fn floor_now(&self, step: u64, slope: f64) -> Option<f64> {
        self.levels
            .first()?
            .done
            .iter()
            .rev()
            .take(FLOOR_SEGS)
            .map(|s| s.min + slope * step.saturating_sub(s.min_step) as f64)
            .min_by(f64::total_cmp)
    }

    fn signal(&mut self, step: u64) -> Signal {
        // The finest confirmed level has the most recent view of the slope.
        let Some((lvl, v)) = self
            .levels
            .iter()
            .filter(|l| l.confirmed())
            .find_map(|l| l.last.map(|v| (l, v)))
        else {
            self.quiet = self.quiet.saturating_add(1);
            if self.quiet >= QUIET_EVALUATIONS {
                self.onset = None;
            }
            return Signal {
                active: false,
                evidence: Evidence::default(),
            };
        };
        self.quiet = 0;
        // The window that showed the rise first: its start is the onset, fixed from now on.
        let onset = *self.onset.get_or_insert(Onset {
            step: v.start_step,
            floor: v.start_floor,
        });
        let recent = &self.levels[0].done;
        let peak = recent.iter().map(|s| s.peak).max().unwrap_or(0);
        let (first, last) = (recent.front(), recent.back());
        let secs_per_step = match (first, last) {
            (Some(a), Some(b)) if b.last_step > a.first_step && b.t1 > a.t0 => {
                Some((b.t1 - a.t0) / (b.last_step - a.first_step) as f64)
            }
            _ => None,
        };
        let slope = envelope_slope(&lvl.done).unwrap_or(v.slope);
        // detection.md: OOM comes at the step peak, so steps ≈ (limit − recent peak) / slope.
        let eta_steps = self
            .limit
            .map(|limit| (limit.saturating_sub(peak) as f64 / slope).round() as u64);
        let floor = self.floor_now(step, slope).unwrap_or(onset.floor);
        let grown = |from: f64| (floor - from).max(0.0) as u64;
        let span = lvl
            .done
            .back()
            .map(|s| s.last_step.saturating_sub(v.start_step))
            .unwrap_or(0);
        Signal {
            active: true,
            evidence: Evidence {
                slope_bytes_per_step: Some(slope),
                slope_bytes_per_second: secs_per_step.map(|s| slope / s),
                growth_bytes: Some(grown(onset.floor)),
                confidence: Some(1.0 - v.p),
                onset_step: Some(onset.step),
                onset_floor_bytes: Some(onset.floor as u64),
                floor_bytes: Some(floor as u64),
                window_start_step: Some(v.start_step),
                window_growth_bytes: Some(grown(v.start_floor)),
                oom_eta_steps: eta_steps,
                oom_eta_seconds: eta_steps.zip(secs_per_step).map(|(n, s)| n as f64 * s),
                alloc_limit: self.cap,
                outside_allocator_bytes: (self.floor == Floor::Outside).then_some(self.last as u64),
                reserved_bytes: (self.floor == Floor::Reserved).then_some(self.last as u64),
                allocated_bytes: self.last_alloc,
                alloc_conf: self.alloc_conf.clone(),
                step: Some(step),
                detail: Some(format!("window of {span} steps")),
                ..Evidence::default()
            },
        }
    }
}

/// The floor where a window starts, from the minima of its first third: the bottom of them, as
/// what a step leaves allocated is the floor plus whatever is alive at the boundary, never less;
/// the second lowest, so that one dip under the floor (a free just before the boundary) cannot
/// make the growth since look larger than it is.
fn floor_of(mins: impl Iterator<Item = f64>) -> Option<f64> {
    let mut low = [f64::INFINITY; 2];
    for m in mins {
        if m < low[0] {
            low = [m, low[0]];
        } else if m < low[1] {
            low[1] = m;
        }
    }
    [low[1], low[0]].into_iter().find(|m| m.is_finite())
}

/// The floor's rate over a confirmed window: the lower envelope of its minima, each where it was
/// seen. None when the envelope is not a rise (a window whose bottom is flat in the middle):
/// the caller keeps the Theil–Sen slope that confirmed it.
fn envelope_slope(done: &VecDeque<Seg>) -> Option<f64> {
    let x: Vec<f64> = done.iter().map(|s| s.min_step as f64).collect();
    let y: Vec<f64> = done.iter().map(|s| s.min).collect();
    lower_envelope_slope(&x, &y).filter(|b| *b > 0.0)
}

/// Judges one level's window; `Some` when it shows a material, sustained rise.
fn judge(done: &VecDeque<Seg>, trend: RunningMk, material: f64) -> Option<Verdict> {
    let n = done.len();
    if n < MIN_WINDOW {
        return None;
    }
    let p = trend.p(n);
    if p > P_MAX {
        return None;
    }
    let y: Vec<f64> = done.iter().map(|s| s.min).collect();
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
    // Not carried back along the slope, as the current floor is carried forward: where the
    // leak began inside the window the first third is flat, and that would put it under the
    // real floor.
    let start_floor = floor_of(y[..k].iter().copied())?;
    Some(Verdict {
        p,
        slope,
        start_step: done.front()?.first_step,
        start_floor,
    })
}

impl Detector for Leak {
    fn kind(&self) -> Kind {
        match self.floor {
            Floor::Allocated => Kind::Leak,
            Floor::Outside => Kind::UntrackedGrowth,
            Floor::Reserved => Kind::CacheGrowth,
        }
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
        if !s.phase.is_train() {
            return None;
        }
        let floor = match self.floor {
            Floor::Allocated => s.stats.allocated?,
            Floor::Outside => obs.outside?,
            Floor::Reserved => s.stats.reserved?,
        };
        // cache_growth judges reserved against allocated: a sample without both says nothing.
        let alloc_min = match self.floor {
            Floor::Reserved => {
                let a = s.stats.allocated?;
                self.last_alloc = Some(a);
                if self.alloc_conf.is_none() {
                    self.alloc_conf = obs.alloc_conf.map(str::to_owned);
                }
                a as f64
            }
            Floor::Allocated | Floor::Outside => 0.0,
        };
        self.last = floor as f64;
        self.train_samples += 1;
        let step = s.step.unwrap_or(self.train_samples);
        // A step count that starts over, or a repeated step, stands for one step.
        let covered = self.prev_step.map_or(1, |p| step.saturating_sub(p).max(1));
        self.prev_step = Some(step);
        let first = *self.first_step.get_or_insert(step);
        // Once over, the warm-up stays over, even if the step count starts again.
        let warmup = match self.floor {
            Floor::Reserved => cache::WARMUP_STEPS,
            Floor::Allocated | Floor::Outside => WARMUP_STEPS,
        };
        self.warmed_up |= step.saturating_sub(first) >= warmup;
        if !self.warmed_up {
            return None;
        }
        let seg = Seg {
            first_step: step,
            last_step: step,
            t0: s.ts,
            t1: s.ts,
            min: floor as f64,
            min_step: step,
            alloc_min,
            // The forecast is to where the step peak meets the limit; memory outside the
            // allocator moves the limit (less free on the device), not the peak. Reserved only
            // grows within a step: it is its own peak.
            peak: match self.floor {
                Floor::Allocated => s.stats.allocated_peak.unwrap_or(floor).max(floor),
                Floor::Outside => s.stats.allocated_peak.or(s.stats.allocated).unwrap_or(0),
                Floor::Reserved => floor,
            },
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
