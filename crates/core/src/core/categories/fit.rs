//! What batch would fit. The assumption (docs/categories.md): parameters, gradients, optimizer
//! state and buffers do not change with the batch; activations do, and the rest of the step
//! peak (temporaries, workspaces) in proportion to them. With one batch size seen, activations
//! are taken as proportional to it; with several (a last short batch, a batch-size ramp), a
//! line is fitted through the activations measured at each and its error stated. Per batch size
//! the most activations seen count (with variable sequence lengths, the longest seen), so at the
//! batch measured the prediction is that step's peak or more, never less.

use serde::{Deserialize, Serialize};

use super::Split;

/// Largest batch ever answered: past this the figure means "any batch you would try".
const MAX_BATCH: u64 = 1 << 24;
/// The margin kept under the limit, at least: 1/20 of it (the allocator rounds blocks up and
/// caches; a bigger batch fragments more). The fragmentation measured now is kept when larger.
const MARGIN_DIV: u64 = 20;

/// How sure the prediction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FitBasis {
    /// One batch size seen: activations and temporaries assumed proportional to the batch.
    Proportional,
    /// Several batch sizes seen: a line fitted through the activations at each.
    Fitted,
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
    /// activations measured there.
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
}

/// The margin under `limit`: a twentieth of it, or the allocator's split blocks now when more.
pub fn margin(limit: u64, inactive_split: Option<u64>) -> u64 {
    (limit / MARGIN_DIV).max(inactive_split.unwrap_or(0))
}

/// A least-squares line through (batch, activations): (intercept, slope, largest relative
/// error). None with fewer than two distinct batch sizes or a slope that is not positive.
fn line(points: &[(u64, u64)]) -> Option<(f64, f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points
        .iter()
        .map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my))
        .sum();
    let slope = sxy / sxx;
    if !slope.is_finite() || slope <= 0.0 {
        return None;
    }
    let intercept = my - slope * mx;
    let err = points
        .iter()
        .map(|&(b, a)| ((intercept + slope * b as f64) - a as f64).abs() / a as f64)
        .fold(0.0, f64::max);
    Some((intercept, slope, err))
}

pub(super) fn fit(
    split: &Split,
    points: &[(u64, u64)],
    limit: u64,
    inactive_split: Option<u64>,
) -> Option<BatchFit> {
    let c = &split.measured;
    let batch = c.batch_size.filter(|b| *b > 0)?;
    let peak = split.peak_bytes?;
    if !c.activations_known() || c.activations_bytes == 0 {
        return None;
    }
    let act = c.activations_bytes as f64;
    // Temporaries scale as the activations do: each activation byte brings `k` bytes of peak.
    let k = 1.0 + split.other_bytes.unwrap_or(0) as f64 / act;
    // What does not scale, from the latest step: its peak less its activations and temporaries.
    let unscaled = (peak as f64 - act * k).max(0.0);
    // Activations at a batch of n: intercept + slope·n, through the most seen per batch size.
    let (basis, intercept, slope, err) = match line(points) {
        Some((a0, a1, err)) => (FitBasis::Fitted, a0.max(0.0), a1, Some(err)),
        None => {
            let most = points
                .iter()
                .find(|p| p.0 == batch)
                .map_or(act, |p| p.1 as f64)
                .max(act);
            (FitBasis::Proportional, 0.0, most / batch as f64, None)
        }
    };
    let per_sample = slope * k;
    let fixed = unscaled + intercept * k;
    let margin_bytes = margin(limit, inactive_split);
    let budget = limit.saturating_sub(margin_bytes) as f64;
    let largest = if budget <= fixed {
        0
    } else {
        ((budget - fixed) / per_sample)
            .floor()
            .min(MAX_BATCH as f64) as u64
    };
    let mut batch_sizes: Vec<u64> = points.iter().map(|p| p.0).collect();
    if basis == FitBasis::Proportional {
        batch_sizes = vec![batch];
    }
    batch_sizes.sort_unstable();
    Some(BatchFit {
        basis,
        batch_sizes,
        bytes_per_sample: per_sample.round() as u64,
        fixed_bytes: fixed.round() as u64,
        limit_bytes: limit,
        margin_bytes,
        max_error_ratio: err,
        largest_safe_batch: largest,
    })
}
