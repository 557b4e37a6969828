//! `crash`: a session's connection closed without `bye`; `stopped`: it closed so after the
//! trainer said it received a signal. Raised by the session itself when it ends; this file only
//! gathers what the last sample said.

use super::Evidence;
use crate::core::trainer::Sample;

/// How long after a signal its trainer may take to end and still count as stopped by it:
/// Kubernetes and Slurm give 30 s by default before SIGKILL; a trainer that checkpoints on
/// SIGTERM may be given more. One that handled the signal and ran on longer, then died, crashed.
pub const STOP_GRACE_SECONDS: f64 = 900.0;

pub fn evidence(last: Option<&Sample>) -> Evidence {
    Evidence {
        step: last.and_then(|s| s.step),
        allocated_bytes: last.and_then(|s| s.stats.allocated),
        device_free: last.and_then(|s| s.device_free),
        ..Evidence::default()
    }
}
