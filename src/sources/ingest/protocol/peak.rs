//! The `armed` and `peak` messages: a trainer's answers to an `arm` request. Checked whole, with
//! the attribution's checks and limits (sites, stacks, strings), before anything is kept; one
//! bad value refuses the message, naming the field and the limit.

use super::attribution::{largest_first, sites, window, MAX_ERROR};
use super::{bounded, byte_value, required, ts, Raw, Rejection};
use crate::core::detect::attribution::MAX_STR;
use crate::core::detect::peak::Peak;
use crate::core::store::sessions::ArmAnswer;

pub(super) fn armed(r: Raw) -> Result<ArmAnswer, Rejection> {
    Ok(ArmAnswer {
        id: required("armed", "id", r.id)?,
        ts: ts("ts", required("armed", "ts", r.ts)?)?,
        error: bounded("error", r.error, MAX_ERROR)?,
        detail: bounded("detail", r.detail, MAX_STR)?,
    })
}

pub(super) fn peak(r: Raw) -> Result<Peak, Rejection> {
    window(r.step_from, r.step_to)?;
    Ok(Peak {
        id: required("peak", "id", r.id)?,
        ts: ts("ts", required("peak", "ts", r.ts)?)?,
        // The daemon names the finding from its own request, never from the client.
        finding: None,
        step_from: r.step_from,
        step_to: r.step_to,
        peak_bytes: byte_value("peak_bytes", r.peak_bytes)?.unwrap_or(0),
        sites: largest_first(sites(r.sites)?),
        error: bounded("error", r.error, MAX_ERROR)?,
        detail: bounded("detail", r.detail, MAX_STR)?,
    })
}

#[cfg(test)]
mod tests;
