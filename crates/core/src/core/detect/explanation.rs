//! OOM explanations: which pattern an out-of-memory error was (pressure, fragmentation, leak), the
//! line that asked and what held the memory, as the trainer read them from its allocator at the
//! moment of the OOM (`gpumon_client.explain`) and sent them with the `oom` event. The daemon only
//! checks, bounds and shows these, as it does leak attributions.

use serde::{Deserialize, Serialize};

use super::attribution::{Frame, Site};

/// Reasons and remedies kept from one explanation, at most.
pub const MAX_NOTES: usize = 8;

/// The three ways a run dies of CUDA OOM, and the verdicts that are not one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// What the step needs is more than the limit, with little cache to give back.
    Pressure,
    /// The cache held enough free memory, but no free block large enough.
    Fragmentation,
    /// Live memory is dominated by one site's blocks, allocated across many steps, never freed.
    Leak,
    /// The snapshot holds no OOM (`explain` on a file taken at another time).
    None,
    /// The evidence did not decide (or a pattern this build does not know).
    #[serde(other)]
    Unknown,
}

impl Pattern {
    pub const ALL: [Pattern; 5] = [
        Pattern::Pressure,
        Pattern::Fragmentation,
        Pattern::Leak,
        Pattern::Unknown,
        Pattern::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::Pressure => "pressure",
            Pattern::Fragmentation => "fragmentation",
            Pattern::Leak => "leak",
            Pattern::None => "none",
            Pattern::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The line whose allocation failed, with the user frames outward from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailingSite {
    pub file: String,
    pub line: u64,
    pub function: String,
    #[serde(default)]
    pub stack: Vec<Frame>,
}

impl FailingSite {
    /// `train.py:37`, as messages name a site.
    pub fn short(&self) -> String {
        let name = self.file.rsplit('/').next().unwrap_or(&self.file);
        format!("{name}:{}", self.line)
    }
}

/// One OOM explained. `live_sites` reuse the attribution's `Site`: there `bytes` and `blocks`
/// are what is live at the site at the OOM, not growth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub pattern: Pattern,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_free_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_free_block_bytes: Option<u64>,
    /// Whether allocation history was recording (whether the lines are known).
    #[serde(default)]
    pub history: bool,
    #[serde(default)]
    pub failing_site: Option<FailingSite>,
    #[serde(default)]
    pub live_sites: Vec<Site>,
    #[serde(default)]
    pub reasons: Vec<String>,
    #[serde(default)]
    pub remedies: Vec<String>,
    #[serde(default)]
    pub message: String,
}

impl Explanation {
    /// The largest live site, when the trainer's history named any.
    pub fn top_live(&self) -> Option<&Site> {
        self.live_sites.first()
    }

    /// Share of the allocated bytes held by a live site, 0..=1.
    pub fn live_share(&self, site: &Site) -> f64 {
        let sum: u64 = self.live_sites.iter().map(|s| s.bytes).sum();
        let denom = self.allocated_bytes.unwrap_or(0).max(sum);
        if denom == 0 {
            0.0
        } else {
            site.bytes as f64 / denom as f64
        }
    }
}

#[cfg(test)]
mod tests;
