//! The split and its remedies in words: one wording for findings' messages, `gpumon status`,
//! the TUI and `gpumon analyze`.

use super::{BatchFit, CategoryEvidence, FitBasis, Split, MAX_BATCH};
use crate::units::bytes;

/// "parameters 2.0 GiB, gradients 2.0 GiB, optimizer state 4.0 GiB, activations 9.1 GiB,
/// other 1.2 GiB (step 1200, batch 16)"; buffers only when they are there.
pub fn split_text(s: &Split) -> String {
    let c = &s.measured;
    let mut parts = vec![
        format!("parameters {}", bytes(c.parameters_bytes)),
        format!("gradients {}", bytes(c.gradients_bytes)),
        format!("optimizer state {}", bytes(c.optimizer_state_bytes)),
    ];
    if c.buffers_bytes > 0 {
        parts.push(format!("buffers {}", bytes(c.buffers_bytes)));
    }
    if c.activations_known() {
        parts.push(format!("activations {}", bytes(c.activations_bytes)));
    } else {
        parts.push("activations not measured".to_string());
    }
    if let Some(o) = s.other_bytes {
        parts.push(format!("other {}", bytes(o)));
    }
    let mut at = format!("step {}", c.step);
    if let Some(b) = c.batch_size {
        at.push_str(&format!(", batch {b}"));
    }
    format!("{} ({at})", parts.join(", "))
}

/// The remedies, each with its size, joined by "; " (empty when the split implies none).
pub fn remedies_text(e: &CategoryEvidence) -> String {
    let r = &e.remedies;
    let mut out = Vec::new();
    if let (Some(b), Some(fit)) = (r.batch, e.fit.as_ref()) {
        out.push(batch_text(b.current, b.fits, fit));
    }
    if let Some(x) = r.checkpointing_bytes {
        out.push(format!("activation checkpointing frees up to {}", bytes(x)));
    }
    if let Some(x) = r.bf16_bytes {
        out.push(format!(
            "bf16 parameters and gradients free {} (half their float32 bytes)",
            bytes(x)
        ));
    }
    if let Some(s) = r.sharding {
        out.push(format!(
            "sharding the optimizer state over the job's {} ranks (ZeRO-1, FSDP) frees {}",
            s.ranks,
            bytes(s.frees_bytes)
        ));
    }
    out.join("; ")
}

/// Batch sizes a fit names one by one; past these, their count and range.
const LISTED_SIZES: usize = 4;

/// How the largest batch was predicted: "scaled from batch 16", "fitted on
/// batches 8, 12 and 16, within 3%", "fitted on 6 batch sizes, 4–24, within 1%". The findings'
/// remedies and the TUI's split say it so.
pub fn fit_basis_text(fit: &BatchFit, current: u64) -> String {
    match fit.basis {
        FitBasis::Proportional => format!(
            "scaled from batch {}",
            fit.batch_sizes.first().copied().unwrap_or(current)
        ),
        FitBasis::Fitted => {
            let on = match fit.batch_sizes.as_slice() {
                [first, .., last] if fit.batch_sizes.len() > LISTED_SIZES => {
                    format!(
                        "{} batch sizes, {first}\u{2013}{last}",
                        fit.batch_sizes.len()
                    )
                }
                sizes => format!("batches {}", list(sizes)),
            };
            format!("fitted on {on}{}", line_error(fit))
        }
    }
}

/// "a batch of 15 fits (now 16; how it was predicted)", or why none does.
fn batch_text(current: u64, fits: u64, fit: &BatchFit) -> String {
    let how = fit_basis_text(fit, current);
    match fits {
        0 if fit.fixed_bytes > fit.limit_bytes => format!(
            "no batch fits: what does not scale with it ({}) is over the {} the allocator can hold",
            bytes(fit.fixed_bytes),
            bytes(fit.limit_bytes)
        ),
        0 if fit.limit_bytes == 0 => "no batch fits: the allocator can hold nothing".to_string(),
        0 => format!(
            "no batch fits: what does not scale with it takes {} of the {} the allocator can hold, less the {} kept free",
            bytes(fit.fixed_bytes),
            bytes(fit.limit_bytes),
            bytes(fit.margin_bytes)
        ),
        n if n < current => format!("a batch of {n} fits (now {current}; {how})"),
        n if n >= MAX_BATCH => {
            format!("any batch up to {n} fits (now {current}; {how})")
        }
        n => format!("a batch of up to {n} fits (now {current}; {how})"),
    }
}

/// ", within 2%": only where it says something (`BatchFit::stated_error_percent`).
fn line_error(fit: &BatchFit) -> String {
    fit.stated_error_percent()
        .map(|e| format!(", within {e}%"))
        .unwrap_or_default()
}

/// "8, 12 and 16".
fn list(xs: &[u64]) -> String {
    match xs {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!(
            "{} and {last}",
            init.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
