//! How the TUI looks at the daemon's findings: the daemon's own typed `Finding` (a newer
//! daemon's unknown kinds, states and severities read as `Unknown`), plus the few derived
//! properties the screens sort and colour by.

use crate::core::detect::explanation::{Explanation, Pattern};
use crate::core::detect::findings::Severity;
use crate::core::detect::{FindingState, Kind};
use crate::core::model::Timestamp;

pub use crate::core::detect::Finding;

/// Lifecycle position, in the order the Findings screen lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    Firing,
    Pending,
    Resolved,
    Other,
}

pub trait FindingView {
    fn state(&self) -> State;
    fn firing(&self) -> bool {
        self.state() == State::Firing
    }
    fn critical(&self) -> bool;
    /// The time the Findings screen sorts by: when it resolved, else when it started firing.
    fn sort_ts(&self) -> Timestamp;
    /// A short label for badges: "leak", "near", "frag", "oom", "crash", "outside", "orphan",
    /// "cache".
    fn badge(&self) -> &'static str;
    /// An OOM's explanation, when the trainer sent one.
    fn explanation(&self) -> Option<&Explanation>;
    /// The trainer caught this OOM and went on (samples came after it).
    fn survived(&self) -> bool;
    /// The kind as lists name it, with an explained OOM's pattern when it decided one:
    /// "oom pressure", "oom frag", "oom leak"; at most 13 columns.
    fn label(&self) -> String;
    /// The GPU index the daemon resolved for it (MIG instances to their parent's index).
    fn gpu_index(&self) -> Option<u32>;
    /// Whether it is about the trainer or process `session`/`pid` on `gpu`: the one rule every
    /// screen joins findings to rows by. A trainer's finding belongs to its session; one without
    /// a session (an aggregate over many trainers), or a row without one, matches by pid, and
    /// by GPU where both know it.
    fn concerns(&self, session: Option<&str>, pid: u32, gpu: Option<u32>) -> bool {
        match (self.session(), session) {
            (Some(id), Some(row)) => id == row,
            _ => {
                self.pid() == pid
                    && match (self.gpu_index(), gpu) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    }
            }
        }
    }
    /// Its session id, when a single trainer's.
    fn session(&self) -> Option<&str>;
    fn pid(&self) -> u32;
}

impl FindingView for Finding {
    fn gpu_index(&self) -> Option<u32> {
        self.gpu
    }

    fn session(&self) -> Option<&str> {
        Some(self.subject.session.as_str()).filter(|s| !s.is_empty())
    }

    fn pid(&self) -> u32 {
        self.subject.pid
    }

    fn state(&self) -> State {
        match self.state {
            FindingState::Firing => State::Firing,
            FindingState::Pending => State::Pending,
            FindingState::Resolved => State::Resolved,
            FindingState::Unknown => State::Other,
        }
    }

    fn critical(&self) -> bool {
        self.severity == Severity::Critical
    }

    fn sort_ts(&self) -> Timestamp {
        self.resolved_ts.or(self.since).unwrap_or(self.updated_ts)
    }

    fn badge(&self) -> &'static str {
        match self.kind {
            Kind::NearLimit => "near",
            Kind::Fragmentation => "frag",
            Kind::UntrackedGrowth => "outside",
            Kind::CacheGrowth => "cache",
            Kind::OrphanedMemory => "orphan",
            k => k.as_str(),
        }
    }

    fn explanation(&self) -> Option<&Explanation> {
        (self.kind == Kind::Oom)
            .then_some(self.evidence.explanation.as_deref())
            .flatten()
    }

    fn survived(&self) -> bool {
        self.kind == Kind::Oom && self.evidence.survived == Some(true)
    }

    fn label(&self) -> String {
        // "frag" as the fragmentation finding's badge: "oom fragmentation" would not fit.
        let pattern = match self.explanation().map(|e| e.pattern) {
            Some(Pattern::Pressure) => "pressure",
            Some(Pattern::Fragmentation) => "frag",
            Some(Pattern::Leak) => "leak",
            // Undecided: the explanation says why, the badge has no room to.
            Some(Pattern::Unknown | Pattern::None) | None => return self.kind.as_str().into(),
        };
        format!("{} {pattern}", self.kind.as_str())
    }
}

#[cfg(test)]
mod tests;
