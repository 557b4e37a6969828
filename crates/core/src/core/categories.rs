//! Where a trainer's memory goes (docs/categories.md): the split the client measures on one
//! step now and then (parameters, gradients, optimizer state, buffers, activations, the batch),
//! the rest of the step peak, and what would fit. The daemon keeps the latest split and the
//! activations seen at each batch size, and from them predicts the step peak at another batch
//! (`fit.rs`) and the remedies an OOM or near_limit message gives with their size (`text.rs`).

use serde::{Deserialize, Serialize};

use crate::core::model::Timestamp;

mod fit;
mod text;

pub use fit::{near_limit_margin, BatchFit, Budget, FitBasis, MAX_BATCH};
pub use text::{fit_basis_text, remedies_text, split_text};

/// One measured step, as the client sends it (`sample.categories`): bytes of this device's
/// tensors, each storage counted once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Categories {
    pub step: u64,
    pub parameters_bytes: u64,
    pub gradients_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub buffers_bytes: u64,
    /// What autograd saved for backward in the step's forward, at most at once.
    pub activations_bytes: u64,
    /// The first dimension of the first tensor the outermost module got; None when unknown.
    pub batch_size: Option<u64>,
    /// Of parameters and gradients, the bytes in float32: what bf16 would halve. None when the
    /// client did not say (older clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp32_bytes: Option<u64>,
    /// Why some figure is known to be off ("code: explanation"); empty when the split is whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partial: Vec<String>,
}

/// A 1 GiB fp32 model with AdamW (gradients 1 GiB, state 2 GiB) measured at step 3, for tests
/// across the workspace (the gpumon crate's tests get it through the `fixtures` feature).
#[cfg(any(test, feature = "fixtures"))]
pub fn example(batch_size: Option<u64>, activations_bytes: u64) -> Categories {
    const GIB: u64 = 1 << 30;
    Categories {
        step: 3,
        parameters_bytes: GIB,
        gradients_bytes: GIB,
        optimizer_state_bytes: 2 * GIB,
        buffers_bytes: 0,
        activations_bytes,
        batch_size,
        fp32_bytes: Some(2 * GIB),
        partial: Vec::new(),
    }
}

/// `partial` codes that make the activations figure unusable for scaling with the batch.
const ACTIVATIONS_UNKNOWN: [&str; 2] = ["activations_unmeasured", "no_grad_forward"];

impl Categories {
    /// Parameters, gradients, optimizer state and buffers: what does not scale with the batch.
    pub fn fixed_bytes(&self) -> u64 {
        self.parameters_bytes
            .saturating_add(self.gradients_bytes)
            .saturating_add(self.optimizer_state_bytes)
            .saturating_add(self.buffers_bytes)
    }

    /// Everything the split names.
    pub fn named_bytes(&self) -> u64 {
        self.fixed_bytes().saturating_add(self.activations_bytes)
    }

    /// Whether a `partial` entry has this code.
    pub fn partial_has(&self, code: &str) -> bool {
        self.partial
            .iter()
            .any(|p| p.split(':').next().map(str::trim) == Some(code))
    }

    /// Whether the activations figure is what the step saved (not missed or absent).
    pub fn activations_known(&self) -> bool {
        !ACTIVATIONS_UNKNOWN.iter().any(|c| self.partial_has(c))
    }

    /// Whether the optimizer state is sharded across ranks already (sharding it again frees
    /// nothing the split could size). Gradients kept outside `.grad` are DeepSpeed ZeRO-1/2's
    /// own buffers: its optimizer state is partitioned too.
    pub fn sharded(&self) -> bool {
        [
            "zero3_partitions",
            "sharded_parameters",
            "dtensor_local",
            "gradients_elsewhere",
        ]
        .iter()
        .any(|c| self.partial_has(c))
    }
}

/// The latest split with the step peak it was measured at: the API session's `categories`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Split {
    #[serde(flatten)]
    pub measured: Categories,
    /// When the split arrived (its sample's time).
    pub ts: Timestamp,
    /// The allocator's peak (`allocated_bytes.all.peak`) in that sample: the step peak when
    /// the trainer resets it each step, else the highest of any step so far.
    pub peak_bytes: Option<u64>,
    /// The peak less everything named: temporaries, workspaces and what nothing else names;
    /// None without a peak.
    pub other_bytes: Option<u64>,
}

impl Split {
    /// `allocated_peak`: the sample's `allocated_bytes.all.peak` (a figure, not the sample's
    /// stats: the trainer's types carry a split, so this module does not name theirs).
    pub fn new(measured: Categories, ts: Timestamp, allocated_peak: Option<u64>) -> Self {
        let peak_bytes = allocated_peak;
        let other_bytes = peak_bytes.map(|p| p.saturating_sub(measured.named_bytes()));
        Self {
            measured,
            ts,
            peak_bytes,
            other_bytes,
        }
    }
}

/// Batch sizes remembered with the activations measured at them (distinct sizes, newest kept).
const FIT_POINTS: usize = 16;

/// What was measured at one batch size: the most activations, and the highest allocator peak
/// of the samples that carried those splits (None when none had one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    pub batch: u64,
    pub activations: u64,
    pub peak: Option<u64>,
}

/// A session's splits: the latest, and the activations seen per batch size, to learn how the
/// step's memory scales with the batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tracker {
    latest: Option<Split>,
    /// One per batch size, oldest first.
    points: Vec<Point>,
    /// Splits taken (the metric's freshness, the TUI's "measured n times").
    pub measured: u64,
    /// near_limit's configured margin (`detect.headroom_margin_bytes`): a batch the fit says
    /// fits keeps at least near_limit's headroom, so the two never contradict each other.
    near_limit_margin: u64,
}

impl Tracker {
    /// A tracker for a session whose near_limit fires under `near_limit_margin` bytes of headroom.
    pub fn new(near_limit_margin: u64) -> Self {
        Self {
            near_limit_margin,
            ..Self::default()
        }
    }

    /// Takes a split measured in a sample with this allocator peak. Per batch size the most
    /// activations and the highest peak seen are kept: with variable sequence lengths the batch
    /// that fits is the one that fits the longest sequences seen, not the latest.
    pub fn take(&mut self, c: Categories, ts: Timestamp, allocated_peak: Option<u64>) {
        if let (Some(b), true) = (c.batch_size, c.activations_known()) {
            if b > 0 && c.activations_bytes > 0 {
                match self.points.iter_mut().find(|p| p.batch == b) {
                    Some(p) => {
                        p.activations = p.activations.max(c.activations_bytes);
                        p.peak = p.peak.max(allocated_peak);
                    }
                    None => {
                        if self.points.len() == FIT_POINTS {
                            self.points.remove(0);
                        }
                        self.points.push(Point {
                            batch: b,
                            activations: c.activations_bytes,
                            peak: allocated_peak,
                        });
                    }
                }
            }
        }
        self.latest = Some(Split::new(c, ts, allocated_peak));
        self.measured += 1;
    }

    pub fn latest(&self) -> Option<&Split> {
        self.latest.as_ref()
    }

    /// How the step peak scales with the batch, against what the allocator can hold less a
    /// margin (`fit::margin`); None when the split cannot say.
    pub fn fit(&self, budget: Budget) -> Option<BatchFit> {
        let near = near_limit_margin(self.near_limit_margin, budget.cap);
        fit::fit(self.latest.as_ref()?, &self.points, budget, near)
    }

    /// The split and its remedies, for a finding's evidence.
    pub fn evidence(&self, budget: Budget, world_size: Option<u64>) -> Option<CategoryEvidence> {
        let split = self.latest.clone()?;
        let fit = self.fit(budget);
        let remedies = Remedies::of(&split, fit.as_ref(), world_size);
        Some(CategoryEvidence {
            split,
            largest_safe_batch: fit.as_ref().map(|f| f.largest_safe_batch),
            fit,
            remedies,
        })
    }
}

/// What a near_limit or OOM finding says of where the memory went and what would shrink it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryEvidence {
    pub split: Split,
    pub largest_safe_batch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<BatchFit>,
    pub remedies: Remedies,
}

/// The remedies the split implies, each with the bytes it frees (docs/categories.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Remedies {
    /// The batch now and the largest predicted to fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchRemedy>,
    /// Activation checkpointing frees up to the activations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointing_bytes: Option<u64>,
    /// bf16 parameters and gradients halve their float32 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_bytes: Option<u64>,
    /// Sharding the optimizer state over the job's ranks frees (W−1)/W of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharding: Option<ShardingRemedy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRemedy {
    pub current: u64,
    pub fits: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardingRemedy {
    pub ranks: u64,
    pub frees_bytes: u64,
}

impl Remedies {
    pub fn of(split: &Split, fit: Option<&BatchFit>, world_size: Option<u64>) -> Self {
        let c = &split.measured;
        let batch = match (c.batch_size, fit) {
            (Some(current), Some(f)) => Some(BatchRemedy {
                current,
                fits: f.largest_safe_batch,
            }),
            _ => None,
        };
        let checkpointing_bytes =
            Some(c.activations_bytes).filter(|b| *b > 0 && c.activations_known());
        // Never more than half of parameters and gradients (the wire refuses more; a trace
        // written by an older daemon is read through the same apply).
        let bf16_bytes = c
            .fp32_bytes
            .map(|b| b.min(c.parameters_bytes.saturating_add(c.gradients_bytes)) / 2)
            .filter(|b| *b > 0);
        let sharding = match world_size {
            Some(w) if w > 1 && !c.sharded() => Some(ShardingRemedy {
                ranks: w,
                frees_bytes: sharded_away(c.optimizer_state_bytes, w),
            })
            .filter(|s| s.frees_bytes > 0),
            _ => None,
        };
        Self {
            batch,
            checkpointing_bytes,
            bf16_bytes,
            sharding,
        }
    }
}

/// What sharding `state` bytes over `ranks` takes off each rank: all but its share, the share
/// rounded up (the largest rank's), exact at any size.
fn sharded_away(state: u64, ranks: u64) -> u64 {
    let share = (u128::from(state)).div_ceil(u128::from(ranks.max(1)));
    state.saturating_sub(u64::try_from(share).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
