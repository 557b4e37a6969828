//! Findings as the outside world sees them (API, metrics, alerts), and the node-wide registry:
//! recently resolved findings, counts by kind, and an outbox of transitions for alert sinks.
//! Everything here is bounded: the outbox drops its oldest entry (counted) when nobody drains it,
//! crash findings of ended sessions are aggregated past a few (held.rs), and log lines have a
//! budget (log_limit.rs).

mod held;
pub mod log_limit;
pub mod transition;

use serde::{Deserialize, Serialize};

use super::attribution::Attribution;
use super::peak::Peak;
use super::{Evidence, Kind};
use crate::core::model::Timestamp;
use crate::util::bounded::Bounded;
use held::{Group, Held, HELD_MAX, PER_JOB};
use log_limit::LogLimit;
pub use transition::{consequence_message, consequence_text, who, Transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingState {
    Pending,
    Firing,
    Resolved,
    /// A state this build does not know (a newer daemon's).
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Critical,
    /// A severity this build does not know (a newer daemon's).
    #[serde(other)]
    Unknown,
}

impl FindingState {
    pub fn as_str(self) -> &'static str {
        match self {
            FindingState::Pending => "pending",
            FindingState::Firing => "firing",
            FindingState::Resolved => "resolved",
            FindingState::Unknown => "unknown",
        }
    }

    /// Pending or firing: not over yet.
    pub fn open(self) -> bool {
        matches!(self, FindingState::Pending | FindingState::Firing)
    }
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
            Severity::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for FindingState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Who a finding is about: copied from the session so a finding stands on its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Subject {
    pub session: String,
    pub job: Option<String>,
    /// The run of the job (hello's `run_id`): with `job`, which job the finding is of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The session's uid, as the socket's peer credentials gave it: with `job` and `run_id`,
    /// whose job (jobs.md); none for a finding of no session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
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
    /// NVML index of the GPU, filled in by the API from the latest collection; a string on
    /// the wire, as the `gpu` label is.
    #[serde(default, with = "crate::core::model::gpu_label")]
    pub gpu: Option<u32>,
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
    /// near_limit findings: what was live at the step peak, by site, when the armed trainer
    /// measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<Peak>,
    /// A failure that followed another rank's within the job's cascade window: that rank's
    /// failure is the cause, and this one is a warning that does not page (jobs.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consequence_of: Option<ConsequenceOf>,
}

/// Resolved findings kept for the API.
const RECENT: usize = 256;
/// Transitions waiting for the alert sinks.
const OUTBOX: usize = 4096;

#[derive(Debug)]
pub struct Findings {
    recent: Bounded<Finding>,
    /// Findings raised (fired), by kind, since start.
    totals: [u64; Kind::SLOTS],
    outbox: Bounded<Finding>,
    /// Crash findings of ended sessions, firing until their hold expires.
    held: Vec<Held>,
    /// The uid of the session being closed, for the crash finding its close may raise (the
    /// detectors' `Subject` does not carry it).
    closing_uid: Option<u32>,
    /// Aggregated findings raised, for their ids.
    aggregates: u64,
    log: LogLimit,
}

impl Default for Findings {
    fn default() -> Self {
        Self {
            recent: Bounded::new(RECENT),
            totals: [0; Kind::SLOTS],
            outbox: Bounded::new(OUTBOX),
            held: Vec::new(),
            closing_uid: None,
            aggregates: 0,
            log: LogLimit::new("finding"),
        }
    }
}

impl Findings {
    pub fn fired(&mut self, f: &Finding) {
        self.totals[f.kind.index()] += 1;
        if self.log.allow(f.updated_ts) {
            tracing::warn!(
                finding = %f.id, kind = f.kind.as_str(), job = f.subject.job.as_deref().unwrap_or(""),
                pid = f.subject.pid, message = %f.message, "finding firing"
            );
        }
        self.post(f.clone());
    }

    pub fn updated(&mut self, f: &Finding) {
        self.post(f.clone());
    }

    pub fn resolved(&mut self, f: Finding) {
        if self.log.allow(f.resolved_ts.unwrap_or(f.updated_ts)) {
            tracing::info!(finding = %f.id, kind = f.kind.as_str(), "finding resolved");
        }
        self.post(f.clone());
        self.recent.push(f);
    }

    /// Says whose session is being closed: the crash finding its close raises (`hold`) is
    /// grouped by this uid and the session's job.
    pub fn closing(&mut self, uid: Option<u32>) {
        self.closing_uid = uid;
    }

    /// A crash: firing now, resolved by `tick` once its hold has passed. Past a few crashes of
    /// one (uid, job), or once `HELD_MAX` are held, it is counted in an aggregated finding.
    pub fn hold(&mut self, f: Finding) {
        let uid = self.closing_uid.take();
        let job = f.subject.job.clone();
        let consequence = f.consequence_of.is_some();
        let by_job = Group::Job(uid, job.clone(), consequence, f.kind);
        let by_uid = Group::Uid(uid);
        if let Some(i) = self.aggregate_of(&by_job).or_else(|| {
            (self.held.len() >= HELD_MAX)
                .then(|| self.aggregate_of(&by_uid))
                .flatten()
        }) {
            self.totals[f.kind.index()] += 1;
            let h = &mut self.held[i];
            held::bump(h, 1, Some(&f));
            if h.group
                .as_ref()
                .is_some_and(|(_, n)| held::worth_posting(*n))
            {
                let update = h.f.clone();
                self.post(update);
            }
            return;
        }
        let same = self
            .held
            .iter()
            .filter(|h| h.of_job(uid, &job, consequence, f.kind))
            .count();
        if same < PER_JOB && self.held.len() < HELD_MAX {
            self.fired(&f);
            self.held.push(Held {
                f,
                uid,
                group: None,
            });
            return;
        }
        // Fold: the job's own findings when it has too many, else (the cap reached) this one
        // alone, into a finding for the job or for the uid.
        let (group, members) = if same >= PER_JOB {
            let members: Vec<Held> = self.take_held(|h| h.of_job(uid, &job, consequence, f.kind));
            (by_job, members)
        } else {
            (by_uid, Vec::new())
        };
        self.aggregates += 1;
        let id = format!("crashes-{}", self.aggregates);
        let first_ts = members
            .iter()
            .map(|h| h.f.first_ts)
            .fold(f.first_ts, f64::min);
        let n = members.len() as u64 + 1;
        // Each crash counts once: the members fired already; this one fires as the aggregate.
        let agg = held::aggregate(self.aggregates, group, f.clone(), n, first_ts);
        self.fired(&agg.f);
        self.held.push(agg);
        let why = format!("counted in {id}");
        for mut m in members {
            m.f.transition(Transition::Resolve {
                at: f.updated_ts,
                why: Some(&why),
            });
            self.resolved(m.f);
        }
    }

    fn aggregate_of(&self, g: &Group) -> Option<usize> {
        self.held
            .iter()
            .position(|h| h.group.as_ref().is_some_and(|(x, _)| x == g))
    }

    fn take_held(&mut self, which: impl Fn(&Held) -> bool) -> Vec<Held> {
        let (taken, keep) = std::mem::take(&mut self.held).into_iter().partition(which);
        self.held = keep;
        taken
    }

    /// A failure whose session ended: held firing like a crash (the cause of a job's failure
    /// must outlive its session), never folded with others. At the cap it resolves as before.
    pub fn hold_cause(&mut self, mut f: Finding, now: Timestamp) {
        if self.held.len() >= HELD_MAX {
            f.transition(Transition::Resolve { at: now, why: None });
            self.resolved(f);
            return;
        }
        f.updated_ts = now;
        let uid = self.closing_uid;
        self.post(f.clone());
        self.held.push(Held {
            f,
            uid,
            group: None,
        });
    }

    /// Makes the held findings of `session` the consequence of another failure: warnings from
    /// now on, and the sinks get the change (its failure was taken for the cause until an
    /// earlier one was read).
    pub fn relabel(&mut self, session: &str, of: &ConsequenceOf, now: Timestamp) {
        let mut changed = Vec::new();
        for h in &mut self.held {
            if h.group.is_some() || h.f.subject.session != session {
                continue;
            }
            if h.f.transition(Transition::ConsequenceOf { of, at: now }) {
                changed.push(h.f.clone());
            }
        }
        for f in changed {
            self.post(f);
        }
    }

    /// Resolves the held finding `id` before its time, saying why (its trainer came back).
    /// It was raised, so it still counts in the totals.
    pub fn release(&mut self, id: &str, now: Timestamp, why: &str) -> bool {
        let Some(i) = self.held.iter().position(|h| h.f.id == id) else {
            return false;
        };
        let mut f = self.held.remove(i).f;
        f.transition(Transition::Resolve {
            at: now,
            why: Some(why),
        });
        self.resolved(f);
        true
    }

    /// Resolves held findings whose time is up: `hold_seconds` after their latest crash.
    pub fn tick(&mut self, now: Timestamp, hold_seconds: f64) {
        self.log.roll(now);
        let done = self.take_held(|h| now - h.f.updated_ts >= hold_seconds);
        for Held { mut f, .. } in done {
            f.transition(Transition::Resolve { at: now, why: None });
            self.resolved(f);
        }
        if self.held.capacity() > 2 * self.held.len().max(PER_JOB) {
            // After a flood the list is short again: give its memory back.
            self.held.shrink_to_fit();
        }
    }

    fn post(&mut self, f: Finding) {
        self.outbox.push(f);
    }

    /// Takes the transitions posted since the last call (fired, refreshed, resolved).
    pub fn drain(&mut self) -> Vec<Finding> {
        self.outbox.drain().collect()
    }

    pub fn totals(&self) -> impl Iterator<Item = (Kind, u64)> + '_ {
        Kind::ALL.iter().map(|k| (*k, self.totals[k.index()]))
    }

    pub fn outbox_dropped(&self) -> u64 {
        self.outbox.dropped()
    }

    pub fn recent(&self) -> impl DoubleEndedIterator<Item = &Finding> {
        self.recent.iter()
    }

    pub fn held(&self) -> impl Iterator<Item = &Finding> {
        self.held.iter().map(|h| &h.f)
    }

    /// Finding log lines left out since start (over the budget).
    pub fn log_suppressed(&self) -> u64 {
        self.log.suppressed()
    }
}

/// A finding that is the consequence of another rank's failure (jobs.md: `consequence_of`): the
/// failure of the job's rank that came first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsequenceOf {
    pub session: String,
    pub rank: Option<u64>,
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

#[cfg(test)]
mod tests;
