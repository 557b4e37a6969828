//! How the TUI looks at the daemon's findings: the daemon's own typed `Finding` (a newer
//! daemon's unknown kinds, states and severities read as `Unknown`), plus the few derived
//! properties the screens sort and colour by.

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
    /// A short label for badges: "leak", "near", "frag", "oom", "crash".
    fn badge(&self) -> &'static str;
}

impl FindingView for Finding {
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
            k => k.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_documented_shape() {
        let f: Finding = serde_json::from_value(json!({
            "id":"s-3/leak","kind":"leak","state":"firing","severity":"critical",
            "session":"s-3","job":"llama-ft","rank":0,"pid":4242,"ns_pid":17,
            "gpu_uuid":"GPU-1","gpu":"0","first_step":812,"first_ts":1763700406.0,
            "since":1763700406.0,"updated_ts":1763700500.0,"resolved_ts":null,
            "message":"allocated floor grows","hint":"store loss.item()",
            "evidence":{"slope_bytes_per_step":2097152.0,"oom_eta_steps":30500,"confidence":0.999},
            "attribution":{"id":1,"ts":1763700300.0,"step_from":60,"step_to":180,
                "total_growth_bytes":125829120,"sites":[{"file":"/home/alice/proj/train.py",
                "line":27,"function":"kept_outputs","bytes":125829120,"blocks":120,
                "stack":[{"file":"/home/alice/proj/train.py","line":48,"function":"run"}]}]}
        }))
        .unwrap();
        assert_eq!(f.kind, Kind::Leak);
        assert!(f.firing() && f.critical());
        assert_eq!(f.gpu.as_deref(), Some("0"));
        assert_eq!(
            (f.subject.pid, f.subject.ns_pid, f.subject.rank),
            (4242, Some(17), Some(0))
        );
        assert_eq!(f.evidence.oom_eta_steps, Some(30500));
        assert_eq!(f.sort_ts(), 1763700406.0);
        let a = f.attribution.as_ref().unwrap();
        assert_eq!(a.sites[0].short(), "train.py:27");
    }

    #[test]
    fn a_newer_daemons_kinds_states_and_severities_read_as_unknown() {
        let f: Finding = serde_json::from_value(json!({
            "id":"s-9/thrash","kind":"thrash","state":"silenced","severity":"info",
            "session":"s-9","pid":1,"first_ts":1.0,"updated_ts":2.0,"message":"m",
            "evidence":{},"new_field":[1, 2]
        }))
        .unwrap();
        assert_eq!(f.kind, Kind::Unknown);
        assert_eq!(f.kind.as_str(), "unknown");
        assert_eq!(f.state(), State::Other);
        assert_eq!(f.severity, Severity::Unknown);
        assert!(!f.firing() && !f.critical());
        assert_eq!(f.badge(), "unknown");
    }
}
