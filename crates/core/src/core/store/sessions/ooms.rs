//! A session's OOMs, newest first: every `oom` event counts, and what is kept of them is bounded
//! whatever a client sends. The newest keeps the trainer's whole explanation; older ones a
//! summary of a few hundred bytes; past `KEPT`, only a count.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::core::detect::explanation::{Explanation, Pattern};
use crate::core::model::Timestamp;

/// OOMs kept per session: batch-size search runs out of memory a handful of times on purpose;
/// the newest few say what the search went through, and the count says the rest.
pub const KEPT: usize = 4;

/// One OOM, as the API shows it in a session's `ooms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomRecord {
    pub ts: Timestamp,
    /// The session's step at the OOM (its latest sample's).
    pub step: Option<u64>,
    /// What the allocator was asked for: the explanation's, else the event's `alloc_bytes`.
    pub request_bytes: Option<u64>,
    /// The trainer's verdict; null when it sent no explanation.
    pub pattern: Option<Pattern>,
    /// `oomlib.py:37`: the line that asked, when the trainer knew it.
    pub failing_site: Option<String>,
    /// The largest live site (`oomlib.py:32`) and what was live there.
    pub top_live_site: Option<String>,
    pub top_live_bytes: Option<u64>,
    /// A sample came after it: the trainer caught it and went on.
    pub survived: bool,
    /// The step of that sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub survived_step: Option<u64>,
    /// The whole explanation, on the newest OOM only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Box<Explanation>>,
}

/// A session's `ooms` (newest first) and `ooms_omitted` (older ones no longer listed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ooms {
    pub ooms: VecDeque<OomRecord>,
    pub ooms_omitted: u64,
    /// `oom` events since the latest sample, listed or omitted: those the next sample marks
    /// survived.
    #[serde(skip)]
    unsurvived: u64,
}

impl Ooms {
    pub fn push(
        &mut self,
        ts: Timestamp,
        step: Option<u64>,
        alloc_bytes: Option<u64>,
        explanation: Option<&Explanation>,
    ) {
        // Only the newest keeps its explanation: the one before becomes a summary.
        if let Some(prev) = self.ooms.front_mut() {
            prev.explanation = None;
        }
        let top = explanation.and_then(Explanation::top_live);
        self.ooms.push_front(OomRecord {
            ts,
            step,
            request_bytes: explanation.and_then(|x| x.request_bytes).or(alloc_bytes),
            pattern: explanation.map(|x| x.pattern),
            failing_site: explanation
                .and_then(|x| x.failing_site.as_ref())
                .map(|f| f.short()),
            top_live_site: top.map(|s| s.short()),
            top_live_bytes: top.map(|s| s.bytes),
            survived: false,
            survived_step: None,
            explanation: explanation.map(|x| Box::new(x.clone())),
        });
        self.unsurvived += 1;
        if self.ooms.len() > KEPT {
            self.ooms.pop_back();
            self.ooms_omitted += 1;
        }
    }

    /// The same OOMs without the newest's whole explanation (its summary fields kept), for
    /// `/api/v1/snapshot`: the explanation is up to tens of KB per session, and the oom
    /// finding's `evidence.explanation` and `/api/v1/sessions/{id}` carry it.
    pub fn summaries(&self) -> Self {
        Self {
            ooms: self
                .ooms
                .iter()
                .map(|o| OomRecord {
                    ts: o.ts,
                    step: o.step,
                    request_bytes: o.request_bytes,
                    pattern: o.pattern,
                    failing_site: o.failing_site.clone(),
                    top_live_site: o.top_live_site.clone(),
                    top_live_bytes: o.top_live_bytes,
                    survived: o.survived,
                    survived_step: o.survived_step,
                    explanation: None,
                })
                .collect(),
            ooms_omitted: self.ooms_omitted,
            unsurvived: self.unsurvived,
        }
    }

    /// A sample arrived: every OOM before it was caught, and the run went on. Returns how many
    /// `oom` events this marked survived (omitted ones included), each counted once: the node's
    /// `gpumon_ooms_survived_total` counts these, so it never exceeds `gpumon_ooms_total`.
    pub fn went_on(&mut self, step: Option<u64>) -> u64 {
        for o in self.ooms.iter_mut().take_while(|o| !o.survived) {
            o.survived = true;
            o.survived_step = step;
        }
        std::mem::take(&mut self.unsurvived)
    }
}

/// Node-wide OOM counts since start (`gpumon_ooms_total{pattern}`, `gpumon_ooms_survived_total`):
/// two words per pattern kept by the aggregator, read when a scrape encodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomCounts {
    by_pattern: [u64; COUNTED.len()],
    /// `oom` events with a sample after them: a subset of what `event` counted (a rise in a
    /// trainer's `num_ooms` without an event is counted per trainer only).
    pub survived: u64,
}

/// The patterns the counter has series for; an `oom` event without an explanation counts as
/// `unknown`, as does a `none` no daemon should receive.
pub const COUNTED: [Pattern; 4] = [
    Pattern::Pressure,
    Pattern::Fragmentation,
    Pattern::Leak,
    Pattern::Unknown,
];

impl OomCounts {
    pub fn event(&mut self, explanation: Option<&Explanation>) {
        let p = explanation.map_or(Pattern::Unknown, |x| x.pattern);
        let i = COUNTED
            .iter()
            .position(|c| *c == p)
            .unwrap_or(COUNTED.len() - 1);
        self.by_pattern[i] += 1;
    }

    /// Every counted pattern with its count, zeros included (a series that appears at 1 hides
    /// its first increase from Prometheus).
    pub fn by_pattern(&self) -> impl Iterator<Item = (Pattern, u64)> + '_ {
        COUNTED.iter().copied().zip(self.by_pattern.iter().copied())
    }
}

#[cfg(test)]
mod tests;
