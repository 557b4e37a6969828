//! The simulated trainers' memory, as a function of time since the demo started. The trainer
//! processes report it over the socket and the simulated NVML lists the same processes with the
//! same memory (reserved + CUDA context), so both views agree as they would on a real node.

use crate::core::categories::Categories;
use crate::core::trainer::Stats;

pub const GIB: f64 = 1073741824.0;
pub const MIB: f64 = 1048576.0;
/// H100 80GB, as NVML reports it.
pub const TOTAL: u64 = 85_520_809_984;
/// Driver/firmware reserved memory on each simulated GPU.
pub const DRIVER_RESERVED: u64 = 567_279_616;
/// What a CUDA context costs outside PyTorch's allocator.
pub const CONTEXT: f64 = 512.0 * MIB;
/// Steps per second of every simulated trainer.
pub const STEPS_PER_SECOND: f64 = 5.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// Flat floor after warm-up.
    Healthy,
    /// Keeps each step's output alive (a metrics list at train.py:27): the floor grows 8 MiB per
    /// step until the GPU is full, then an OOM kills it and it starts over.
    Leak,
    /// Flat floor with the step peak at the device limit: the allocator keeps retrying. It
    /// reports where its memory goes (`split`): a 3B-parameter model in float32 with Adam,
    /// batch 16, each epoch's last batch short.
    NearLimit,
    /// Its allocator flat, but memory outside it grows 4 MiB per step after warm-up (as a
    /// communicator made every step would), for 3 GiB; then it holds.
    Untracked,
}

/// The healthy trainer's reserved memory: it shares GPU 0 with the leaking one.
const HEALTHY_RESERVED: f64 = 24.0 * GIB;

impl Profile {
    pub fn job(self) -> &'static str {
        match self {
            Profile::Healthy => "demo-healthy",
            Profile::Leak => "demo-leak",
            Profile::NearLimit => "demo-near-limit",
            Profile::Untracked => "demo-untracked",
        }
    }

    /// Index of the simulated GPU it runs on.
    pub fn gpu(self) -> usize {
        match self {
            Profile::Healthy | Profile::Leak | Profile::Untracked => 0,
            Profile::NearLimit => 1,
        }
    }

    /// Seconds between the leaking trainer's OOM restarts: until its peak meets the limit, beside
    /// the other two trainers of GPU 0 at their largest (the untracked one has stopped growing
    /// by the first OOM).
    pub fn period(self) -> Option<f64> {
        match self {
            Profile::Leak => {
                let limit = TOTAL as f64
                    - DRIVER_RESERVED as f64
                    - HEALTHY_RESERVED
                    - 2.0 * CONTEXT
                    - UNTRACKED_MOST
                    - GIB;
                let start = 8.0 * GIB + 7.0 * GIB;
                Some((limit - start) / (LEAK_PER_STEP * STEPS_PER_SECOND))
            }
            _ => None,
        }
    }

    /// Bytes the floor grows by each step: what one kept output holds (the leak only).
    pub fn leak_per_step(self) -> Option<u64> {
        match self {
            Profile::Leak => Some(LEAK_PER_STEP as u64),
            _ => None,
        }
    }

    /// When (seconds since the demo started) the run that is live at `t` runs out of memory:
    /// the first period boundary after `t`.
    pub fn oom_after(self, t: f64) -> Option<f64> {
        let p = self.period()?;
        let mut end = ((t.max(0.0) / p).floor() + 1.0) * p;
        // Rounding can land on `t` itself when `t` is a boundary: that run has already ended.
        if end <= t {
            end += p;
        }
        Some(end)
    }

    /// The allocator's stats at `t` seconds, and the step.
    pub fn at(self, t: f64) -> (u64, Stats) {
        let t = t.max(0.0);
        let local = self.period().map_or(t, |p| t % p);
        let step = (local * STEPS_PER_SECOND) as u64;
        // Small deterministic jitter: real floors are rarely perfectly flat.
        let jitter = ((step.wrapping_mul(2_654_435_761) >> 7) % 64) as f64 * MIB;
        let (floor, peak, reserved, retries) = match self {
            Profile::Healthy => {
                let warm = if step < 3 {
                    step as f64 * 2.0 * GIB
                } else {
                    6.0 * GIB
                };
                let floor = 8.0 * GIB + warm + jitter;
                (floor, floor + 9.0 * GIB, HEALTHY_RESERVED, 0)
            }
            Profile::Leak => {
                let floor = 8.0 * GIB + step as f64 * LEAK_PER_STEP + jitter;
                (floor, floor + 6.0 * GIB, floor + 7.0 * GIB, 0)
            }
            Profile::NearLimit => {
                let floor = 52.0 * GIB + jitter;
                let reserved = near::reserved();
                (floor, near::peak(near::batch(step)), reserved, step / 25)
            }
            Profile::Untracked => {
                let floor = 3.0 * GIB + jitter;
                (floor, floor + 1.5 * GIB, UNTRACKED_RESERVED, 0)
            }
        };
        let stats = Stats {
            allocated: Some(floor as u64),
            allocated_peak: Some(peak as u64),
            reserved: Some(reserved as u64),
            active: Some(floor as u64),
            inactive_split: Some(((reserved - peak).max(0.0) * 0.3) as u64),
            requested: Some((floor * 0.995) as u64),
            alloc_retries: Some(retries),
            ooms: Some(0),
            ..Stats::default()
        };
        (step, stats)
    }

    /// Where the step's memory goes at `step`, as the client measures it (the near-limit trainer
    /// only): parameters, gradients and Adam's two moments, all float32, buffers, and the
    /// activations of the step's batch; `other` (the peak less these) is what `at` reports
    /// beyond them. Whether a step is measured is `SplitCadence`'s call.
    pub fn split(self, step: u64) -> Option<Categories> {
        if self != Profile::NearLimit {
            return None;
        }
        let batch = near::batch(step);
        Some(Categories {
            step,
            parameters_bytes: near::PARAMETERS as u64,
            gradients_bytes: near::PARAMETERS as u64,
            optimizer_state_bytes: 2 * near::PARAMETERS as u64,
            buffers_bytes: near::BUFFERS as u64,
            activations_bytes: near::activations(batch) as u64,
            batch_size: Some(batch),
            fp32_bytes: Some(2 * near::PARAMETERS as u64),
            partial: Vec::new(),
        })
    }

    /// What NVML shows for the process: its reserved memory plus the CUDA context, plus what
    /// the untracked trainer holds outside its allocator.
    pub fn nvml_used(self, t: f64) -> u64 {
        let (step, s) = self.at(t);
        s.reserved.unwrap_or(0) + CONTEXT as u64 + self.outside_growth(step) as u64
    }

    /// When (seconds since the demo started) the untracked trainer's growth outside its
    /// allocator starts and stops: NVML's figure bends there, and is straight in between.
    pub fn outside_bends(self) -> Option<[f64; 2]> {
        match self {
            Profile::Untracked => {
                let start = UNTRACKED_WARM_STEPS as f64 / STEPS_PER_SECOND;
                Some([
                    start,
                    start + UNTRACKED_GROWTH / UNTRACKED_PER_STEP / STEPS_PER_SECOND,
                ])
            }
            _ => None,
        }
    }

    /// Bytes outside the allocator beyond the CUDA context at `step` (the untracked one only).
    pub fn outside_growth(self, step: u64) -> f64 {
        match self {
            Profile::Untracked => (step.saturating_sub(UNTRACKED_WARM_STEPS) as f64
                * UNTRACKED_PER_STEP)
                .min(UNTRACKED_GROWTH),
            _ => 0.0,
        }
    }
}

/// The near-limit trainer's model and batch: what its split reports and its step peak follows.
mod near {
    use super::{CONTEXT, DRIVER_RESERVED, GIB, MIB, TOTAL};

    /// 3.2B parameters in float32 (12 GiB); gradients as much, Adam's moments twice that.
    pub const PARAMETERS: f64 = 12.0 * GIB;
    pub const BUFFERS: f64 = 256.0 * MIB;
    /// The batch, and the last of each epoch's `EPOCH_STEPS` (the dataset is not a multiple).
    pub const BATCH: u64 = 16;
    pub const SHORT_BATCH: u64 = 10;
    pub const EPOCH_STEPS: u64 = 250;

    /// What does not change with the batch: parameters, gradients, optimizer state, buffers.
    fn fixed() -> f64 {
        4.0 * PARAMETERS + BUFFERS
    }

    /// The allocator's reserve: the whole GPU but its context and 0.4 GiB.
    pub fn reserved() -> f64 {
        TOTAL as f64 - DRIVER_RESERVED as f64 - CONTEXT - 0.4 * GIB
    }

    pub fn batch(step: u64) -> u64 {
        if step % EPOCH_STEPS == EPOCH_STEPS - 1 {
            SHORT_BATCH
        } else {
            BATCH
        }
    }

    /// Saved for backward at a batch of `b`: 1.5625 GiB a sample over 1 GiB that any batch
    /// saves (not quite proportional, as real models are not): 26 GiB at 16.
    pub fn activations(b: u64) -> f64 {
        GIB + b as f64 * 1.5625 * GIB
    }

    /// The step peak at a batch of `b`: 0.2 GiB under the reserve at the full batch, with the
    /// temporaries (the rest of the peak) in proportion to the activations.
    pub fn peak(b: u64) -> f64 {
        let full = reserved() - 0.2 * GIB;
        let per_activation_byte = (full - fixed()) / activations(BATCH);
        fixed() + activations(b) * per_activation_byte
    }
}

/// When a demo trainer measures its split (docs/categories.md), as the client does: the first
/// sampled step from step 3 on, then one every 300 s. Besides, once, the first short batch at
/// an epoch's end and the full batch after it, so the daemon sees two batch sizes and fits a
/// line through them ("fitted") while the latest split stays at the batch the trainer runs.
/// One per connection: a new session starts over.
pub struct SplitCadence {
    /// The first step the next regular split may be at.
    next: u64,
    /// Whether any split was sent on this connection.
    started: bool,
    short_seen: bool,
    after_short: bool,
}

/// Steps between two measured splits: 300 s of demo time.
const SPLIT_EVERY: u64 = 300 * STEPS_PER_SECOND as u64;

impl Default for SplitCadence {
    fn default() -> Self {
        Self {
            next: 3,
            started: false,
            short_seen: false,
            after_short: false,
        }
    }
}

impl SplitCadence {
    /// The split to send with the sample of `step` (sampled steps in order), if measured.
    pub fn at(&mut self, profile: Profile, step: u64) -> Option<Categories> {
        let split = profile.split(step)?;
        if split.batch_size == Some(near::SHORT_BATCH) {
            if self.short_seen || !self.started {
                // Measured once, and never as the first split.
                return None;
            }
            self.short_seen = true;
            self.after_short = true;
            return Some(split);
        }
        if !self.after_short && step < self.next {
            return None;
        }
        self.after_short = false;
        self.started = true;
        self.next = step + SPLIT_EVERY;
        Some(split)
    }
}

const LEAK_PER_STEP: f64 = 8.0 * MIB;
/// The untracked trainer: its allocator's reserve, its steps before the growth starts, the
/// growth per step and in all (then it holds), and the most it holds on the GPU.
const UNTRACKED_RESERVED: f64 = 5.0 * GIB;
const UNTRACKED_WARM_STEPS: u64 = 200;
const UNTRACKED_PER_STEP: f64 = 4.0 * MIB;
const UNTRACKED_GROWTH: f64 = 3.0 * GIB;
const UNTRACKED_MOST: f64 = UNTRACKED_RESERVED + CONTEXT + UNTRACKED_GROWTH;

/// Every simulated trainer, in the order the demo starts them.
pub const ALL: [Profile; 4] = [
    Profile::Healthy,
    Profile::Leak,
    Profile::NearLimit,
    Profile::Untracked,
];

/// Free memory on `gpu` at `t` with only the single trainers counted (`job::device_free` takes
/// the job's ranks off it too: the job sits above the profiles, not beside them).
pub fn singles_free(gpu: usize, t: f64) -> u64 {
    let used: u64 = ALL
        .iter()
        .filter(|p| p.gpu() == gpu)
        .map(|p| p.nvml_used(t))
        .sum::<u64>();
    TOTAL.saturating_sub(DRIVER_RESERVED + used)
}

/// Bytes the way torch's messages (and the client) write them: "2.00 GiB".
pub fn human(n: u64) -> String {
    let mut value = n as f64;
    for unit in ["bytes", "KiB", "MiB"] {
        if value < 1024.0 {
            return if unit == "bytes" {
                format!("{n} bytes")
            } else {
                format!("{value:.2} {unit}")
            };
        }
        value /= 1024.0;
    }
    format!("{value:.2} GiB")
}

/// A demo trainer's `sample` line: what the real client sends from `memory_stats()` and
/// `mem_get_info()` (the single trainers and the job's ranks alike).
/// `categories`, when given, is the split measured at that step (the wire's field names are
/// `Categories`' own).
pub fn sample_line(
    ts: f64,
    step: u64,
    stats: &crate::core::trainer::Stats,
    device_free: u64,
    categories: Option<&Categories>,
) -> serde_json::Value {
    let mut line = serde_json::json!({
        "type": "sample", "ts": ts, "step": step, "phase": "train",
        "stats": {
            "allocated_bytes.all.current": stats.allocated,
            "allocated_bytes.all.peak": stats.allocated_peak,
            "reserved_bytes.all.current": stats.reserved,
            "active_bytes.all.current": stats.active,
            "inactive_split_bytes.all.current": stats.inactive_split,
            "requested_bytes.all.current": stats.requested,
            "num_alloc_retries": stats.alloc_retries,
            "num_ooms": stats.ooms,
        },
        "device_free": device_free, "device_total": TOTAL,
    });
    if let (Some(c), Some(obj)) = (categories, line.as_object_mut()) {
        obj.insert("categories".into(), serde_json::json!(c));
    }
    line
}

#[cfg(test)]
mod tests;
