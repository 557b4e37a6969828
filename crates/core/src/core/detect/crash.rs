//! `crash`: a session's connection closed without `bye`. Raised by the session itself when it
//! ends; this file only gathers what the last sample said.

use super::Evidence;
use crate::core::trainer::Sample;

pub fn evidence(last: Option<&Sample>) -> Evidence {
    Evidence {
        step: last.and_then(|s| s.step),
        allocated_bytes: last.and_then(|s| s.stats.allocated),
        device_free: last.and_then(|s| s.device_free),
        ..Evidence::default()
    }
}
