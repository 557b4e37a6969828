//! Findings as the outside world sees them (API, metrics, alerts), and the node-wide registry:
//! recently resolved findings, counts by kind, and an outbox of transitions for alert sinks.
//! Everything here is bounded: the outbox drops its oldest entry (counted) when nobody drains it.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::attribution::Attribution;
use super::{Evidence, Kind};
use crate::model::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingState {
    Pending,
    Firing,
    Resolved,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Critical,
}

/// Who a finding is about: copied from the session so a finding stands on its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Subject {
    pub session: String,
    pub job: Option<String>,
    pub rank: Option<u64>,
    /// Host pid (SO_PEERCRED).
    pub pid: u32,
    pub ns_pid: Option<u64>,
    pub gpu_uuid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable for the life of the finding: `<session>/<kind>`, with `#n` when raised again.
    pub id: String,
    pub kind: Kind,
    pub state: FindingState,
    pub severity: Severity,
    #[serde(flatten)]
    pub subject: Subject,
    /// NVML index of the GPU, filled in by the API from the latest collection.
    #[serde(default)]
    pub gpu: Option<String>,
    /// Step and time at which it was first raised (went pending).
    pub first_step: Option<u64>,
    pub first_ts: Timestamp,
    /// When it started firing.
    pub since: Option<Timestamp>,
    pub updated_ts: Timestamp,
    pub resolved_ts: Option<Timestamp>,
    pub message: String,
    pub hint: Option<String>,
    pub evidence: Evidence,
    /// Leak findings: where the growing memory was allocated, when the trainer measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<Attribution>,
}

/// Resolved findings kept for the API.
const RECENT: usize = 256;
/// Transitions waiting for the alert sinks.
const OUTBOX: usize = 4096;

#[derive(Debug, Default)]
pub struct Findings {
    recent: VecDeque<Finding>,
    /// Findings raised (fired), by kind, since start.
    totals: [u64; Kind::ALL.len()],
    outbox: VecDeque<Finding>,
    outbox_dropped: u64,
    /// Crash findings of ended sessions, firing until their hold expires.
    held: Vec<Finding>,
}

impl Findings {
    pub fn fired(&mut self, f: &Finding) {
        self.totals[f.kind.index()] += 1;
        tracing::warn!(
            finding = %f.id, kind = f.kind.as_str(), job = f.subject.job.as_deref().unwrap_or(""),
            pid = f.subject.pid, message = %f.message, "finding firing"
        );
        self.post(f.clone());
    }

    pub fn updated(&mut self, f: &Finding) {
        self.post(f.clone());
    }

    pub fn resolved(&mut self, f: Finding) {
        tracing::info!(finding = %f.id, kind = f.kind.as_str(), "finding resolved");
        self.post(f.clone());
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(f);
    }

    /// A crash: firing now, resolved by `tick` once `until` has passed.
    pub fn hold(&mut self, f: Finding) {
        self.fired(&f);
        self.held.push(f);
    }

    /// Resolves the held finding `id` before its time, saying why (its trainer came back).
    /// It was raised, so it still counts in the totals.
    pub fn release(&mut self, id: &str, now: Timestamp, why: &str) -> bool {
        let Some(i) = self.held.iter().position(|f| f.id == id) else {
            return false;
        };
        let mut f = self.held.remove(i);
        f.state = FindingState::Resolved;
        f.resolved_ts = Some(now);
        f.updated_ts = now;
        f.message = format!("{}; {why}", f.message);
        f.evidence.detail = Some(why.to_string());
        self.resolved(f);
        true
    }

    /// Resolves held findings whose time is up.
    pub fn tick(&mut self, now: Timestamp, hold_seconds: f64) {
        let (done, keep): (Vec<Finding>, Vec<Finding>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|f| now - f.first_ts >= hold_seconds);
        self.held = keep;
        for mut f in done {
            f.state = FindingState::Resolved;
            f.resolved_ts = Some(now);
            f.updated_ts = now;
            self.resolved(f);
        }
    }

    fn post(&mut self, f: Finding) {
        if self.outbox.len() == OUTBOX {
            self.outbox.pop_front();
            self.outbox_dropped += 1;
        }
        self.outbox.push_back(f);
    }

    /// Takes the transitions posted since the last call (fired, refreshed, resolved).
    pub fn drain(&mut self) -> Vec<Finding> {
        self.outbox.drain(..).collect()
    }

    pub fn totals(&self) -> impl Iterator<Item = (Kind, u64)> + '_ {
        Kind::ALL.iter().map(|k| (*k, self.totals[k.index()]))
    }

    pub fn outbox_dropped(&self) -> u64 {
        self.outbox_dropped
    }

    pub fn recent(&self) -> impl DoubleEndedIterator<Item = &Finding> {
        self.recent.iter()
    }

    pub fn held(&self) -> impl Iterator<Item = &Finding> {
        self.held.iter()
    }
}
