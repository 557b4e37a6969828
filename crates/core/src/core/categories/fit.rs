//! What batch would fit. The assumption (docs/categories.md): parameters, gradients, optimizer
//! state and buffers do not change with the batch; activations do, and the rest of the step
//! peak (temporaries, workspaces) in proportion to them. With one batch size seen, activations
//! are taken as proportional to it; with several (a last short batch, a batch-size ramp), a
//! line is fitted through the activations measured at each and its error stated. Whatever the
//! line says, the prediction at a batch size seen is never under a peak measured there: a fit
//! that said a batch fits while near_limit fires at a smaller one would be advice to OOM.

use serde::{Deserialize, Serialize};

use super::{Point, Split};

/// Largest batch ever answered: past this the figure means "any batch you would try". The
/// wire refuses a larger `batch_size` (protocol/categories.rs), so the batch now is never
/// above what the fit can answer.
pub const MAX_BATCH: u64 = 1 << 24;
/// The margin kept under the limit, at least: 1/20 of it (the allocator rounds blocks up and
/// caches; a bigger batch fragments more). The fragmentation measured now is kept when larger,
/// and so is near_limit's own margin: a batch that fits does not make near_limit fire.
const MARGIN_DIV: u64 = 20;
/// Under an allocator cap near_limit's margin is at most 1/`CAP_MARGIN_DIV` of the cap.
const CAP_MARGIN_DIV: u64 = 10;
/// A line further than this share off the activations measured at some batch size describes
/// nothing (its error would be a figure with no meaning): the fit is proportional instead.
pub const MAX_LINE_ERROR: f64 = 0.5;

/// How sure the prediction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FitBasis {
    /// One batch size seen (or a line that fits them badly): activations and temporaries
    /// assumed proportional to the batch.
    Proportional,
    /// Several batch sizes seen: a line fitted through the activations at each.
    Fitted,
}

/// What a batch must fit under at one sample (`detect::Obs::budget`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// What the allocator could hold (`Obs::limit`).
    pub limit: Option<u64>,
    /// The allocator's cap where it binds (`Obs::cap`): near_limit's margin is at most a tenth.
    pub cap: Option<u64>,
    /// The allocator's split blocks now (`inactive_split_bytes.all.current`).
    pub inactive_split: Option<u64>,
}

/// The step peak as a function of the batch, and the largest batch under the limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchFit {
    pub basis: FitBasis,
    /// The batch sizes the fit learned from, ascending.
    pub batch_sizes: Vec<u64>,
    /// Step-peak bytes each sample of the batch adds (activations and temporaries).
    pub bytes_per_sample: u64,
    /// The step peak predicted at a batch of 0: what does not scale.
    pub fixed_bytes: u64,
    /// What the allocator can hold (`Obs::limit`) and the margin kept under it.
    pub limit_bytes: u64,
    pub margin_bytes: u64,
    /// Fitted only: the largest error of the line at the batch sizes seen, as a share of the
    /// activations measured there (at most `MAX_LINE_ERROR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_error_ratio: Option<f64>,
    pub largest_safe_batch: u64,
}

impl BatchFit {
    /// The step peak predicted at a batch of `n`.
    pub fn predict(&self, n: u64) -> u64 {
        self.fixed_bytes
            .saturating_add(self.bytes_per_sample.saturating_mul(n))
    }

    /// The line's error in whole percent, rounded up (the error is at most this), where it
    /// says something: a fitted line through three batch sizes or more. Through two it passes
    /// through both, so its error is 0 by construction.
    pub fn stated_error_percent(&self) -> Option<u64> {
        let e = self
            .max_error_ratio
            .filter(|_| self.batch_sizes.len() >= 3)?;
        // At most MAX_LINE_ERROR: 50%.
        Some((e * 100.0).ceil() as u64)
    }

    /// What a batch's step peak must stay within: the limit less the margin.
    pub fn budget_bytes(&self) -> u64 {
        self.limit_bytes.saturating_sub(self.margin_bytes)
    }
}

/// The headroom under which near_limit fires (`detect.headroom_margin_bytes`, `configured`),
/// or a tenth of the cap when one binds and that is less: near_limit and the fit share it.
pub fn near_limit_margin(configured: u64, cap: Option<u64>) -> u64 {
    cap.map_or(configured, |c| configured.min(c / CAP_MARGIN_DIV))
}

/// The margin under the limit: a twentieth of it, the allocator's split blocks now, or
/// near_limit's margin, whichever is most.
pub fn margin(limit: u64, inactive_split: Option<u64>, near_limit: u64) -> u64 {
    (limit / MARGIN_DIV)
        .max(inactive_split.unwrap_or(0))
        .max(near_limit)
}

/// A least-squares line through (batch, activations): (intercept, slope, largest relative
/// error). None with fewer than two distinct batch sizes or a slope that is not positive.
fn line(points: &[Point]) -> Option<(f64, f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.batch as f64).sum::<f64>() / n;
    let my = points.iter().map(|p| p.activations as f64).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.batch as f64 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points
        .iter()
        .map(|p| (p.batch as f64 - mx) * (p.activations as f64 - my))
        .sum();
    let slope = sxy / sxx;
    if !slope.is_finite() || slope <= 0.0 {
        return None;
    }
    let intercept = my - slope * mx;
    let err = points
        .iter()
        .map(|p| {
            ((intercept.max(0.0) + slope * p.batch as f64) - p.activations as f64).abs()
                / p.activations as f64
        })
        .fold(0.0, f64::max);
    Some((intercept, slope, err))
}

/// `x` rounded up to whole bytes, within u64.
fn ceil_bytes(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        // `as` saturates at u64::MAX.
        x.ceil() as u64
    } else {
        0
    }
}

pub(super) fn fit(
    split: &Split,
    points: &[Point],
    budget: Budget,
    near_limit: u64,
) -> Option<BatchFit> {
    let c = &split.measured;
    // A batch past the bound (a trace from before the wire refused one) is none the fit can
    // answer: it would be answered with one up to 256 times smaller.
    let batch = c.batch_size.filter(|b| *b > 0 && *b <= MAX_BATCH)?;
    let peak = split.peak_bytes?;
    let limit = budget.limit?;
    if !c.activations_known() || c.activations_bytes == 0 {
        return None;
    }
    let act = c.activations_bytes as f64;
    // Temporaries scale as the activations do: each activation byte brings `k` bytes of peak.
    let k = 1.0 + split.other_bytes.unwrap_or(0) as f64 / act;
    // What does not scale, from the latest step: its peak less its activations and temporaries.
    let unscaled = (peak as f64 - act * k).max(0.0);
    // Activations at a batch of n: intercept + slope·n, through the most seen per batch size.
    let line = line(points).filter(|l| l.2 <= MAX_LINE_ERROR);
    let (basis, intercept, slope, err) = match line {
        Some((a0, a1, err)) => (FitBasis::Fitted, a0.max(0.0), a1, Some(err)),
        None => {
            let most = points
                .iter()
                .find(|p| p.batch == batch)
                .map_or(act, |p| p.activations as f64)
                .max(act);
            (FitBasis::Proportional, 0.0, most / batch as f64, None)
        }
    };
    // Rounded up, and at least a byte a sample: the prediction errs high, never low.
    let per_sample = ceil_bytes(slope * k).max(1);
    // Peaks measured at the batch sizes seen: the latest one, and each point's.
    let seen: Vec<(u64, u64)> = points
        .iter()
        .filter_map(|p| Some((p.batch, p.peak?)))
        .chain([(batch, peak)])
        .collect();
    // What does not scale is in every step's peak: never more than the lowest measured...
    let lowest = seen.iter().map(|s| s.1).min().unwrap_or(peak);
    let mut fixed = ceil_bytes(unscaled + intercept * k).min(lowest);
    // ...and the prediction is never under a peak measured at its batch size.
    for &(b, p) in &seen {
        fixed = fixed.max(p.saturating_sub(per_sample.saturating_mul(b)));
    }
    // Never more than the limit: what is kept free is a part of it.
    let margin_bytes = margin(limit, budget.inactive_split, near_limit).min(limit);
    let room = limit.saturating_sub(margin_bytes);
    let largest = room
        .checked_sub(fixed)
        .map_or(0, |r| (r / per_sample).min(MAX_BATCH));
    let mut batch_sizes: Vec<u64> = points.iter().map(|p| p.batch).collect();
    if basis == FitBasis::Proportional {
        batch_sizes = vec![batch];
    }
    batch_sizes.sort_unstable();
    Some(BatchFit {
        basis,
        batch_sizes,
        bytes_per_sample: per_sample,
        fixed_bytes: fixed,
        limit_bytes: limit,
        margin_bytes,
        max_error_ratio: err,
        largest_safe_batch: largest,
    })
}
