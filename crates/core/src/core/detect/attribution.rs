//! Leak attribution: where the memory that survives each step was allocated, as a trainer
//! measured it over a recorded window (allocation history between two `torch.cuda.memory`
//! snapshots) and sent it in an `attribution` message. The daemon only checks, bounds and
//! shows these; the diff itself runs in the trainer, next to the snapshots.

use serde::{Deserialize, Serialize};

use crate::core::model::Timestamp;

/// Sites kept from one attribution message, at most.
pub const MAX_SITES: usize = 20;
/// Frames kept per site's stack, at most.
pub const MAX_STACK: usize = 32;
/// Longest file, function, note or detail string accepted, in bytes.
pub const MAX_STR: usize = 512;

/// One frame of an allocation's Python stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub file: String,
    pub line: u64,
    pub function: String,
}

/// Where memory that kept growing was allocated: the innermost frame in the user's code (not
/// torch, site-packages or the client), with the stack beneath it, innermost first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Site {
    pub file: String,
    pub line: u64,
    pub function: String,
    /// Growth of live (`active_allocated`) bytes allocated here over the window.
    pub bytes: u64,
    /// Growth in the number of live blocks allocated here.
    pub blocks: u64,
    #[serde(default)]
    pub stack: Vec<Frame>,
    /// What the trainer's diff noticed about this site (e.g. it grows in step with another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Site {
    /// `train.py:27`: the file's last path component and the line, as messages name a site.
    pub fn short(&self) -> String {
        let name = self.file.rsplit('/').next().unwrap_or(&self.file);
        format!("{name}:{}", self.line)
    }
}

/// What a trainer reported for one request: the window it recorded and its top sites, largest
/// first, or why it could not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attribution {
    /// The request this answers (per connection).
    pub id: u64,
    pub ts: Timestamp,
    /// The finding the request was made for, when the daemon made it (absent in replays).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_from: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_to: Option<u64>,
    /// How long the window lasted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// Growth of all live memory over the window; the sites' shares are of this (0 in an error
    /// answer, which may leave it out).
    #[serde(default)]
    pub total_growth_bytes: u64,
    #[serde(default)]
    pub sites: Vec<Site>,
    /// Set when the trainer could not attribute: `unavailable` (no CUDA, torch too old),
    /// `failed` (recording or the snapshot raised), `cut_short` (the window ended early).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Attribution {
    /// The largest site, when the trainer found any.
    pub fn top(&self) -> Option<&Site> {
        self.sites.first()
    }

    /// A site's share of the window's growth, 0..=1. The denominator is the larger of the total
    /// and the sites' sum, so shares never add up past 1 when other memory shrank meanwhile.
    pub fn share(&self, site: &Site) -> f64 {
        share_of(site, &self.sites, self.total_growth_bytes)
    }
}

/// `site`'s share of `total`, 0..=1: of the larger of `total` and the sites' sum, so a client
/// whose total is smaller (other memory shrank, or it under-reports) never yields one past 1.
pub(crate) fn share_of(site: &Site, sites: &[Site], total: u64) -> f64 {
    let sum: u64 = sites.iter().map(|s| s.bytes).sum();
    let denom = total.max(sum);
    if denom == 0 {
        0.0
    } else {
        site.bytes as f64 / denom as f64
    }
}

/// What the trainer of the kept-outputs fixture (tests/fixtures/torch-snapshots) reports: 120 MiB
/// in 120 blocks at train.py:27 over steps 60–180, for tests across the workspace (the gpumon
/// crate's tests get it through the `fixtures` feature).
#[cfg(any(test, feature = "fixtures"))]
pub fn kept_outputs_example() -> Attribution {
    let frame = |line, function: &str| Frame {
        file: "/home/alice/proj/train.py".into(),
        line,
        function: function.into(),
    };
    Attribution {
        id: 1,
        ts: 1_763_700_300.0,
        finding: Some("s-3/leak".into()),
        step_from: Some(60),
        step_to: Some(180),
        seconds: Some(61.2),
        total_growth_bytes: 125_829_120,
        sites: vec![Site {
            file: "/home/alice/proj/train.py".into(),
            line: 27,
            function: "kept_outputs".into(),
            bytes: 125_829_120,
            blocks: 120,
            stack: vec![
                frame(27, "kept_outputs"),
                frame(48, "run"),
                frame(69, "<module>"),
            ],
            note: None,
        }],
        error: None,
        detail: None,
    }
}

#[cfg(test)]
mod tests;
