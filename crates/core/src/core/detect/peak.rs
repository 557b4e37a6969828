//! The step peak: what was live, by allocation site, at the moment a trainer's live total was
//! highest over a few recorded steps (the `peak` message, docs/protocol.md). It answers
//! pressure's question: which activations to shrink to fit. The trainer replays its recorded
//! history to find the peak; the daemon checks, bounds and shows it, as it does attributions.

use serde::{Deserialize, Serialize};

use super::attribution::Site;
use crate::core::model::Timestamp;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    /// The `arm` request this answers (per connection).
    pub id: u64,
    pub ts: Timestamp,
    /// The finding the arming was for, from the daemon's own request (absent in replays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_from: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_to: Option<u64>,
    /// The highest live total in the recorded steps (0 in an error answer).
    #[serde(default)]
    pub peak_bytes: u64,
    /// What was live at the peak, largest first (`bytes` and `blocks` live then).
    #[serde(default)]
    pub sites: Vec<Site>,
    /// Set when the trainer could not take or read its snapshot (`failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Peak {
    /// The largest site, when the trainer found any.
    pub fn top(&self) -> Option<&Site> {
        self.sites.first()
    }

    /// A site's share of live memory at the peak, 0..=1: of the larger of `peak_bytes` and the
    /// sites' sum, so a client that under-reports the total never yields a share past 1.
    pub fn share(&self, site: &Site) -> f64 {
        super::attribution::share_of(site, &self.sites, self.peak_bytes)
    }
}

/// A peak at model.py:88 (2 GiB of a 4 GiB peak, 48 blocks) over steps 1210–1230, for tests
/// across the workspace (the gpumon crate's tests get it through the `fixtures` feature).
#[cfg(any(test, feature = "fixtures"))]
pub fn attention_example() -> Peak {
    use super::attribution::Frame;
    let frame = |line, function: &str| Frame {
        file: "/home/alice/proj/model.py".into(),
        line,
        function: function.into(),
    };
    let site = |line, function: &str, bytes| Site {
        file: "/home/alice/proj/model.py".into(),
        line,
        function: function.into(),
        bytes,
        blocks: 48,
        stack: vec![frame(line, function), frame(140, "forward")],
        note: None,
    };
    Peak {
        id: 2,
        ts: 1_763_700_410.0,
        finding: Some("s-3/near_limit".into()),
        step_from: Some(1210),
        step_to: Some(1230),
        peak_bytes: 4 << 30,
        sites: vec![site(88, "attention", 2 << 30), site(61, "mlp", 1 << 30)],
        error: None,
        detail: None,
    }
}

#[cfg(test)]
mod tests;
