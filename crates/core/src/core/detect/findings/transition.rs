//! How a finding changes state after it was raised, in one place: it resolves (its condition
//! ended, its hold passed, it was folded into an aggregate, its trainer came back), or it
//! becomes the consequence of another rank's failure (a failure that followed one within the
//! cascade window, or a cause overturned by an earlier failure read later: jobs.md). Raising
//! and refreshing stay with the detectors (session.rs, orphan.rs), which own the evidence.

use super::{ConsequenceOf, Finding, FindingState, Severity};
use crate::core::model::Timestamp;

/// A change of a finding's state.
#[derive(Debug, Clone, Copy)]
pub enum Transition<'a> {
    /// Over at `at`. `why`, when the reason is not the detector's own (folded into an
    /// aggregate, the trainer came back, the process was seen running), ends the message and
    /// is the evidence's detail.
    Resolve { at: Timestamp, why: Option<&'a str> },
    /// It followed `of`, the failure of the job's rank that came first: a warning that says
    /// what it followed, never paging. A later, earlier-read cause replaces the one it named.
    ConsequenceOf {
        of: &'a ConsequenceOf,
        at: Timestamp,
    },
}

impl Finding {
    /// Applies `t`; false when the finding is resolved already (a resolved finding is final:
    /// the sinks were told, and its id is not reused).
    pub fn transition(&mut self, t: Transition) -> bool {
        if self.state == FindingState::Resolved {
            return false;
        }
        match t {
            Transition::Resolve { at, why } => {
                self.state = FindingState::Resolved;
                self.resolved_ts = Some(at);
                self.updated_ts = at;
                if let Some(why) = why {
                    self.message = format!("{}; {why}", self.message);
                    self.evidence.detail = Some(why.to_string());
                }
            }
            Transition::ConsequenceOf { of, at } => {
                self.severity = Severity::Warning;
                self.message = if of.session == self.subject.session {
                    format!("{}; after its own {}", base(&self.message), of.kind)
                } else {
                    consequence_message(&self.message, of)
                };
                self.consequence_of = Some(of.clone());
                self.updated_ts = self.updated_ts.max(at);
            }
        }
        true
    }
}

/// `rank 5` or `session s-17` where the member sent no rank.
pub fn who(rank: Option<u64>, session: &str) -> String {
    rank.map_or_else(|| format!("session {session}"), |r| format!("rank {r}"))
}

/// A finding's message without what it was said to follow.
fn base(message: &str) -> &str {
    message.split("; after ").next().unwrap_or(message)
}

/// What a consequence followed: `rank 5's oom (s-17)`, `rank 5's oom on node-b (s-17)`; the
/// messages and the alerts' `consequence_of` annotation say it so.
pub fn consequence_text(of: &ConsequenceOf) -> String {
    let who = who(of.rank, &of.session);
    let host = of
        .host
        .as_deref()
        .map(|h| format!(" on {h}"))
        .unwrap_or_default();
    format!("{who}'s {}{host} ({})", of.kind, of.session)
}

/// A finding's message with what it followed: `...; after rank 5's oom (s-17)`.
pub fn consequence_message(message: &str, of: &ConsequenceOf) -> String {
    format!("{}; after {}", base(message), consequence_text(of))
}

#[cfg(test)]
mod tests;
