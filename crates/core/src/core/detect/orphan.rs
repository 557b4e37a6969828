//! orphaned_memory: NVML lists memory for a process that /proc says has exited (a zombie its
//! parent has not reaped, or no process at all: something still holds its context), for longer
//! than a grace period. Judged once per poll from the reading alone; a finding per (GPU, pid),
//! firing once the grace has passed and resolved when NVML stops listing the memory.
//!
//! A pid missing from /proc means the process exited only where /proc shows the host's
//! processes (`ProcView::Host`). A daemon in a container without hostPID finds none of NVML's
//! pids in its own /proc: it says so once and judges nothing (`HostPids::Hidden`).

mod words;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::findings::{Finding, FindingState, Findings, Severity, Subject, Transition};
use super::{Evidence, Kind};
use crate::core::model::{GpuState, NodeReading, ProcState, ProcView, ProcessReading, Timestamp};

/// `detect.orphan_grace` by default: a driver frees an exited process's context within seconds,
/// and NVML may list it for a poll or two meanwhile; a minute is past any teardown.
pub const DEFAULT_GRACE_SECONDS: f64 = 60.0;

/// What this daemon can tell of the processes NVML lists (the API's `host_pids`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPids {
    /// /proc shows the host's processes: a listed pid missing there has exited.
    Visible,
    /// /proc is not the host's, but some listed pids are in it: only zombies are judged (a
    /// missing pid may live in a namespace this daemon cannot see).
    Partial,
    /// /proc is not the host's and none of NVML's pids is in it (a container without
    /// hostPID): nothing is judged.
    Hidden,
    /// The NVML library is a fake one listing a scenario's pids (`ProcView::Simulated`): only
    /// zombies are judged (a zombie is in this host's /proc; a missing pid never ran here).
    Simulated,
    #[serde(other)]
    Unknown,
}

/// What the source's view of /proc and the states of one poll's rows say about it; None while
/// no row has a state (nothing listed yet), as nothing can be told then.
pub fn host_pids(
    view: Option<ProcView>,
    states: impl Iterator<Item = Option<ProcState>>,
) -> Option<HostPids> {
    match view {
        Some(ProcView::Host) => return Some(HostPids::Visible),
        Some(ProcView::Simulated) => return Some(HostPids::Simulated),
        _ => {}
    }
    let (mut listed, mut found) = (0usize, 0usize);
    for s in states.flatten() {
        listed += 1;
        found += usize::from(s != ProcState::Gone);
    }
    match (listed, found) {
        (0, _) => None,
        (_, 0) => Some(HostPids::Hidden),
        _ => Some(HostPids::Partial),
    }
}

/// Whether a row is a process that has exited, as far as `seen` lets this daemon judge.
pub fn exited(seen: Option<HostPids>, state: Option<ProcState>) -> bool {
    matches!(
        (seen, state),
        (
            Some(HostPids::Visible),
            Some(ProcState::Zombie | ProcState::Gone)
        ) | (
            Some(HostPids::Partial | HostPids::Simulated),
            Some(ProcState::Zombie)
        )
    )
}

/// What gpumon last knew of a process: the trainer session it ran (from the session store or
/// the jobs registry); all None for a process that never said hello.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Known {
    pub session: Option<String>,
    pub job: Option<String>,
    pub run_id: Option<String>,
    pub rank: Option<u64>,
    pub ns_pid: Option<u64>,
    /// When its session ended (the connection closes as the process exits).
    pub ended: Option<Timestamp>,
}

/// The evidence of an orphaned_memory finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrphanEvidence {
    /// NVML's figure for the pid on the GPU; absent when NVML says "not available".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// `zombie` or `gone`.
    pub state: ProcState,
    /// When gpumon first saw it exited while NVML listed it.
    pub gone_since: Timestamp,
    /// When its trainer session ended, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exited_ts: Option<Timestamp>,
    /// A zombie's parent: the process that has to reap it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What /proc said of the process while it ran (name, user, container, pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The MIG device it ran on, under MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
}

/// A (GPU, pid) NVML lists while its process has exited.
#[derive(Debug)]
struct Watched {
    since: Timestamp,
    /// The poll that last saw it (`Orphans::polls`).
    seen: u64,
    finding: Option<Finding>,
}

/// The node's orphaned memory: what is being watched through its grace and what fires.
#[derive(Debug, Default)]
pub struct Orphans {
    /// By (GPU UUID, pid), in that order for readers; only exited processes NVML lists, so
    /// as many as one reading's rows.
    watched: BTreeMap<(Arc<str>, u32), Watched>,
    host_pids: Option<HostPids>,
    polls: u64,
    /// Findings raised, for their ids.
    raised: u64,
    /// Which verdicts on /proc were said in the log (`note`).
    said: u8,
}

impl Orphans {
    /// What the daemon can tell of NVML's pids, as of the last poll that listed any.
    pub fn host_pids(&self) -> Option<HostPids> {
        self.host_pids
    }

    /// Firing findings.
    pub fn current(&self) -> impl Iterator<Item = &Finding> {
        self.watched.values().filter_map(|w| w.finding.as_ref())
    }

    /// Whether the process `pid` on the GPU `uuid` holds orphaned memory (its finding fires).
    pub fn orphaned(&self, uuid: &str, pid: u32) -> bool {
        self.current()
            .any(|f| f.subject.pid == pid && f.subject.gpu_uuid.as_deref() == Some(uuid))
    }

    /// One poll: `view` is the source's view of /proc; `known` says what gpumon knew of a row's
    /// process. Findings fire into `out` once a row has been an exited process for `grace`
    /// seconds, and resolve when NVML no longer lists it as one.
    pub fn poll(
        &mut self,
        r: &NodeReading,
        view: Option<ProcView>,
        grace: f64,
        known: &dyn Fn(&ProcessReading) -> Known,
        out: &mut Findings,
    ) {
        self.polls += 1;
        let states = r.processes.iter().map(|p| p.info.state);
        if let Some(seen) = host_pids(view, states) {
            self.note(seen);
        }
        let now = r.ts;
        for p in &r.processes {
            if !exited(self.host_pids, p.info.state) {
                continue;
            }
            let w = self
                .watched
                .entry((p.uuid.clone(), p.pid))
                .or_insert(Watched {
                    since: now,
                    seen: 0,
                    finding: None,
                });
            w.seen = self.polls;
            if now - w.since < grace {
                continue;
            }
            let k = known(p);
            match &mut w.finding {
                Some(f) => refresh(f, p, &k, w.since, now),
                None => {
                    self.raised += 1;
                    let f = raise(self.raised, p, &k, w.since, now);
                    out.fired(&f);
                    w.finding = Some(f);
                }
            }
        }
        self.forget(r, out);
    }

    /// Ends what this poll did not see exited: resolved when its GPU was read (NVML no longer
    /// lists it as an exited process); kept while its GPU could not be read.
    fn forget(&mut self, r: &NodeReading, out: &mut Findings) {
        let polls = self.polls;
        let read = |uuid: &str| {
            r.gpus
                .iter()
                .any(|g| g.identity.uuid == uuid && g.state == GpuState::Ok)
        };
        let unread = |uuid: &str| r.gpus.iter().any(|g| g.identity.uuid == uuid) && !read(uuid);
        let hidden = self.host_pids == Some(HostPids::Hidden);
        let done: Vec<(Arc<str>, u32)> = self
            .watched
            .iter()
            .filter(|(k, w)| w.seen != polls && (hidden || !unread(&k.0)))
            .map(|(k, _)| k.clone())
            .collect();
        for key in done {
            let Some(w) = self.watched.remove(&key) else {
                continue;
            };
            let Some(mut f) = w.finding else { continue };
            let listed = r
                .processes
                .iter()
                .any(|p| p.pid == key.1 && p.uuid == key.0);
            let why = match (hidden, listed) {
                (true, _) => "gpumon can no longer see the host's processes",
                (false, true) => "/proc shows the process running",
                (false, false) => "NVML no longer lists its memory",
            };
            f.transition(Transition::Resolve {
                at: r.ts,
                why: Some(why),
            });
            out.resolved(f);
        }
    }

    /// Takes a poll's verdict on what /proc shows, saying what it means the first time each
    /// verdict comes: once, not at every poll, nor each time a node's pids come and go.
    fn note(&mut self, seen: HostPids) {
        self.host_pids = Some(seen);
        let bit = match seen {
            HostPids::Hidden => 1,
            HostPids::Partial => 2,
            HostPids::Simulated => 4,
            HostPids::Visible | HostPids::Unknown => return,
        };
        if self.said & bit != 0 {
            return;
        }
        self.said |= bit;
        if seen == HostPids::Hidden {
            tracing::warn!(
                "none of the processes NVML lists is in /proc: gpumon runs in a PID namespace of its own \
                 (a container without hostPID), so orphaned GPU memory (a process that exited and still \
                 holds memory) is not detected; run it with hostPID, or mount the host's /proc and point \
                 procfs at it"
            );
        } else if seen == HostPids::Simulated {
            tracing::info!(
                "the NVML library is a fake one listing a scenario's processes: orphaned GPU memory is \
                 judged for zombies only (a pid missing from /proc never ran on this host)"
            );
        } else {
            tracing::info!(
                "/proc is not the host's: orphaned GPU memory is judged for zombies only (a pid missing \
                 from /proc may live in another PID namespace)"
            );
        }
    }
}

fn evidence(p: &ProcessReading, k: &Known, since: Timestamp) -> Evidence {
    let i = &p.info;
    let orphan = OrphanEvidence {
        bytes: p.used_memory_bytes,
        state: i.state.unwrap_or(ProcState::Gone),
        gone_since: since,
        exited_ts: k.ended.filter(|e| *e <= since),
        parent_pid: i.ppid.filter(|_| i.state == Some(ProcState::Zombie)),
        parent: i.parent.clone(),
        process: i.name.clone(),
        user: i.user.clone(),
        container: i.container.clone(),
        pod: i.pod.clone(),
        namespace: i.namespace.clone(),
        mig_uuid: p.mig_uuid.as_deref().map(str::to_string),
    };
    Evidence {
        orphan: Some(Box::new(orphan)),
        ..Evidence::default()
    }
}

fn raise(n: u64, p: &ProcessReading, k: &Known, since: Timestamp, now: Timestamp) -> Finding {
    let mut f = Finding {
        id: format!("orphaned-{n}"),
        kind: Kind::OrphanedMemory,
        state: FindingState::Firing,
        severity: Severity::Warning,
        subject: Subject::default(),
        gpu: Some(p.gpu),
        first_step: None,
        first_ts: since,
        since: Some(now),
        updated_ts: now,
        resolved_ts: None,
        message: String::new(),
        hint: None,
        evidence: Evidence::default(),
        attribution: None,
        peak: None,
        consequence_of: None,
    };
    refresh(&mut f, p, k, since, now);
    f
}

/// The finding as this poll sees it: bytes, state, what gpumon knew, and its words (the time
/// since it exited moves on).
fn refresh(f: &mut Finding, p: &ProcessReading, k: &Known, since: Timestamp, now: Timestamp) {
    f.subject = Subject {
        session: k.session.clone().unwrap_or_default(),
        job: k.job.clone(),
        run_id: k.run_id.clone(),
        uid: None,
        rank: k.rank,
        pid: p.pid,
        ns_pid: k.ns_pid,
        gpu_uuid: Some(p.uuid.to_string()),
    };
    f.gpu = Some(p.gpu);
    f.evidence = evidence(p, k, since);
    f.message = words::message(p.gpu, p.pid, &f.subject, &f.evidence, now);
    f.hint = Some(words::hint(p.gpu, p.pid, &f.evidence));
    f.updated_ts = now;
}

#[cfg(test)]
mod tests;
