//! What a simulated trainer's samples say (`--stats`).
//!
//! - `simple` (the default): every figure fixed but allocated memory, which cycles through 97
//!   values, one step per sample. Cheap to make, so a throughput test measures the daemon.
//! - `realistic`: figures that move as `torch.cuda.memory_stats()` does over a training run on
//!   an H100: batches of varying size, a sample landing anywhere in a step's forward/backward
//!   sawtooth, a peak that creeps up, a cache that grows by segments and is freed by an
//!   occasional allocator retry, cumulative cudaMalloc/cudaFree counts, eval stretches, a
//!   varying number of steps between samples and jittered sample times. The daemon stores
//!   histories as deltas, so the flat figures of `simple` cost it less than a real trainer's
//!   do: memory is measured with these.
//!
//! Both are deterministic: the same seed and trainer give the same figures.

use clap::ValueEnum;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The caching allocator rounds blocks to 512 bytes and large segments to 2 MiB.
const BLOCK: u64 = 512;
const SEGMENT: u64 = 2 * MIB;
/// An H100 80GB as `cudaMemGetInfo` reports it (the fake node's GPUs are the same size).
pub const DEVICE_TOTAL: u64 = 85_520_809_984;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Mode {
    #[default]
    Simple,
    Realistic,
}

/// The stats keys a client sends (KNOWN_STATS_KEYS in the Python client), in its order, and
/// what it reads from `cudaMemGetInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub allocated: u64,
    pub allocated_peak: u64,
    pub reserved: u64,
    pub active: u64,
    pub inactive_split: u64,
    pub requested: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
    pub sync_all_streams: u64,
    pub device_alloc: u64,
    /// `num_device_free`: cudaFree calls.
    pub device_frees: u64,
    /// `device_free`: free bytes on the device.
    pub device_free: u64,
    pub device_total: u64,
}

/// One sample's content.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub step: u64,
    pub train: bool,
    /// Seconds to move the sample's time by when its time is made up (history), not read
    /// from the clock: a trainer samples at step boundaries, not on a timer.
    pub jitter: f64,
    pub stats: Stats,
}

pub enum Source {
    Simple,
    Realistic(Box<Model>),
}

impl Source {
    /// `stream` tells trainers of one run apart (their rank).
    pub fn new(mode: Mode, seed: u64, stream: u64) -> Self {
        match mode {
            Mode::Simple => Self::Simple,
            Mode::Realistic => Self::Realistic(Box::new(Model::new(seed, stream))),
        }
    }

    /// The sample after one at `step`.
    pub fn next(&mut self, step: u64) -> Sample {
        match self {
            Self::Simple => simple(step + 1),
            Self::Realistic(m) => m.next(step),
        }
    }
}

/// What the load generator has always sent: only allocated memory moves.
fn simple(step: u64) -> Sample {
    let allocated = 20 * GIB + (step % 97) * MIB;
    Sample {
        step,
        train: true,
        jitter: 0.0,
        stats: Stats {
            allocated,
            allocated_peak: 28 * GIB,
            reserved: 30 * GIB,
            active: allocated,
            inactive_split: 256 * MIB,
            requested: allocated - 74 * MIB,
            alloc_retries: 0,
            ooms: 0,
            sync_all_streams: 0,
            device_alloc: 120,
            device_frees: 3,
            device_free: 47_244_640_256,
            device_total: DEVICE_TOTAL,
        },
    }
}

/// A trainer's allocator over a run. Sizes are drawn per trainer, within what one H100 holds.
pub struct Model {
    rng: Rng,
    /// Weights, gradients and optimizer state: held across steps.
    fixed: u64,
    /// Activations of the largest batch at the turn from forward to backward.
    activations: u64,
    /// Workspaces and temporaries a step allocates on top.
    temporaries: u64,
    /// What splitting cached blocks typically leaves unusable.
    split: u64,
    /// The CUDA context and other memory outside the allocator (cudaMemGetInfo sees it).
    context: u64,
    /// Reserving beyond this fails a cudaMalloc: the allocator frees its cache and retries.
    ceiling: u64,
    /// Training steps between samples, on average (the client's cadence over the step time).
    steps: u64,
    /// Samples left in the current eval stretch, and until the next one.
    eval_left: u32,
    until_eval: u32,
    s: Stats,
}

impl Model {
    fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Rng::new(seed, stream);
        let fixed = blocks(rng.range(8 * GIB, 32 * GIB) as f64);
        let activations = blocks(rng.range(3 * GIB, 12 * GIB) as f64);
        let temporaries = blocks(rng.range(128 * MIB, 768 * MIB) as f64);
        let split = blocks(rng.range(64 * MIB, 512 * MIB) as f64);
        let context = segments(rng.range(480 * MIB, 640 * MIB));
        let ceiling =
            segments(fixed + activations + temporaries + 2 * split + rng.range(GIB, 3 * GIB));
        let reserved = segments(fixed + activations * 6 / 10);
        let device_alloc = reserved / rng.range(16 * MIB, 48 * MIB);
        let steps = rng.range(1, 6);
        let until_eval = rng.range(300, 900) as u32;
        Self {
            rng,
            fixed,
            activations,
            temporaries,
            split,
            context,
            ceiling,
            steps,
            eval_left: 0,
            until_eval,
            s: Stats {
                allocated: fixed,
                allocated_peak: fixed,
                reserved,
                device_alloc,
                device_total: DEVICE_TOTAL,
                ..Stats::default()
            },
        }
    }

    fn next(&mut self, step: u64) -> Sample {
        let r = &mut self.rng;
        // Eval every few hundred samples, for a few dozen: no backward, so few activations
        // kept, and the step count stands still (the client reports the last training step).
        let train = if self.eval_left > 0 {
            self.eval_left -= 1;
            false
        } else {
            self.until_eval -= 1;
            if self.until_eval == 0 {
                self.eval_left = r.range(20, 60) as u32;
                self.until_eval = r.range(300, 900) as u32;
            }
            true
        };
        let step = if train {
            step + r.range(self.steps.saturating_sub(1).max(1), self.steps + 2)
        } else {
            step
        };
        let kept = if train { 1.0 } else { 0.25 };
        // Sequences packed into batches of varying size.
        let batch = 0.55 + 0.45 * r.unit();
        // Where in the step the sample lands: forward builds activations up (40% of the
        // step), backward frees them.
        let at = r.unit();
        let saw = if at < 0.4 { at / 0.4 } else { (1.0 - at) / 0.6 };
        let act = self.activations as f64 * batch * kept;
        let tmp = self.temporaries as f64;
        let s = &mut self.s;
        s.allocated = blocks(self.fixed as f64 + act * saw + tmp * 0.5 * r.unit());
        let step_peak = blocks(self.fixed as f64 + act + tmp * (0.5 + 0.5 * r.unit()));
        s.allocated_peak = s.allocated_peak.max(step_peak).max(s.allocated);

        let split = blocks(self.split as f64 * (0.3 + r.unit()));
        let need = step_peak + split;
        if need > s.reserved {
            // New segments for the step's peak, sized by its requests.
            let add = segments(need - s.reserved + r.range(0, 4) * SEGMENT);
            s.device_alloc += 1 + add / r.range(8 * MIB, 64 * MIB);
            s.reserved += add;
        } else if r.chance(1.0 / 40.0) {
            // A new small-pool segment for tensors of under 1 MiB.
            s.device_alloc += 1;
            s.reserved += SEGMENT;
        }
        if s.reserved > self.ceiling || r.chance(1.0 / 14_400.0) {
            // A cudaMalloc failed: synchronize, free every unused cached segment, retry.
            s.alloc_retries += 1;
            s.sync_all_streams += 1;
            let keep = segments(s.allocated.max(step_peak) + split).min(s.reserved);
            let freed = s.reserved - keep;
            s.device_frees += 1 + freed / r.range(8 * MIB, 64 * MIB);
            s.reserved = keep;
        } else if r.chance(1.0 / 3000.0) {
            // torch.cuda.empty_cache() or a synchronize from elsewhere in the program.
            s.sync_all_streams += 1;
        }
        let cached = s.reserved - s.allocated;
        s.inactive_split = split.min(cached);
        // Blocks freed on one stream while another may still use them stay active a while.
        let pending = if r.chance(0.3) {
            blocks(r.range(0, 16 * MIB) as f64)
        } else {
            0
        };
        s.active = s.allocated + pending.min(cached);
        // What was asked for, before rounding each block up: any byte count.
        s.requested = s.allocated - r.range(0, (6 * MIB).min(s.allocated));
        s.device_free = segments_down(DEVICE_TOTAL.saturating_sub(s.reserved + self.context));
        Sample {
            step,
            train,
            jitter: (r.unit() - 0.5) * 0.08,
            stats: *s,
        }
    }
}

fn blocks(v: f64) -> u64 {
    (v as u64) / BLOCK * BLOCK
}

fn segments(v: u64) -> u64 {
    v.div_ceil(SEGMENT) * SEGMENT
}

fn segments_down(v: u64) -> u64 {
    v / SEGMENT * SEGMENT
}

/// SplitMix64: small, fast and the same everywhere, which is all a load generator needs.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Self {
        let mut r = Self(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        r.next();
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// In [lo, hi) (lo when the range is empty).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo)
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seed: u64, stream: u64, n: usize) -> Vec<Sample> {
        let mut src = Source::new(Mode::Realistic, seed, stream);
        let mut step = 0;
        (0..n)
            .map(|_| {
                let s = src.next(step);
                step = s.step;
                s
            })
            .collect()
    }

    #[test]
    fn the_same_seed_and_trainer_give_the_same_samples() {
        assert_eq!(run(7, 3, 2000), run(7, 3, 2000));
        assert_ne!(run(7, 3, 50), run(8, 3, 50));
        assert_ne!(run(7, 3, 50), run(7, 4, 50));
    }

    /// Over a 3-hour run: the relations torch's figures keep, and figures that keep moving.
    #[test]
    fn figures_move_as_an_allocator_s_do_and_stay_consistent() {
        let mut retries = 0;
        for stream in 0..16 {
            let all = run(1, stream, 10_800);
            let mut prev = all[0];
            let (mut grew, mut dropped, mut eval) = (0, 0, 0);
            let mut allocated = std::collections::HashSet::new();
            for s in &all[1..] {
                let (t, p) = (&s.stats, &prev.stats);
                assert!(
                    t.allocated % BLOCK == 0 && t.reserved % SEGMENT == 0,
                    "{t:?}"
                );
                assert!(t.allocated <= t.active && t.active <= t.reserved, "{t:?}");
                assert!(t.requested <= t.allocated, "{t:?}");
                assert!(t.inactive_split <= t.reserved - t.allocated, "{t:?}");
                assert!(
                    t.allocated_peak >= t.allocated.max(p.allocated_peak),
                    "{t:?}"
                );
                assert!(t.device_free + t.reserved <= t.device_total, "{t:?}");
                for (now, before) in [
                    (t.alloc_retries, p.alloc_retries),
                    (t.sync_all_streams, p.sync_all_streams),
                    (t.device_alloc, p.device_alloc),
                    (t.device_frees, p.device_frees),
                ] {
                    assert!(now >= before, "a cumulative count went back: {t:?}");
                }
                assert_eq!(t.ooms, 0);
                assert!(s.step >= prev.step && s.jitter.abs() <= 0.04);
                assert_eq!(s.step == prev.step, !s.train, "only eval stands still");
                grew += usize::from(t.reserved > p.reserved);
                dropped += usize::from(t.reserved < p.reserved);
                eval += usize::from(!s.train);
                allocated.insert(t.allocated);
                prev = *s;
            }
            assert!(allocated.len() > 10_000, "allocated barely varies");
            assert!(grew > 100, "reserved grew {grew} times");
            assert!(
                dropped as u64 <= prev.stats.alloc_retries,
                "only a retry frees cache"
            );
            retries += prev.stats.alloc_retries;
            assert!((200..2000).contains(&eval), "{eval} eval samples");
            // Within one H100, and no detector should call a healthy run near its limit.
            assert!(prev.stats.reserved < 60 * GIB);
        }
        // About one in four hours: rare enough that a healthy trainer seldom looks near its
        // limit (two retries close together).
        assert!(
            (4..=40).contains(&retries),
            "{retries} retries in 48 trainer-hours"
        );
    }

    #[test]
    fn simple_is_what_the_load_generator_always_sent() {
        let mut src = Source::new(Mode::Simple, 1, 0);
        let s = src.next(41);
        assert_eq!((s.step, s.train, s.jitter), (42, true, 0.0));
        assert_eq!(s.stats.allocated, 20 * GIB + 42 * MIB);
        assert_eq!(s.stats.requested, 20 * GIB + 42 * MIB - 74 * MIB);
    }
}
