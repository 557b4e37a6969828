//! Crash findings held after their sessions ended, bounded. A few crashes of one (uid, job) are
//! held one finding each; past `PER_JOB` they fold into one finding that counts them ("37
//! sessions of job X closed without bye in the last 12 s"), and once `HELD_MAX` findings are
//! held, further crashes are counted per uid. So 100,000 sessions closing without bye hold a
//! handful of findings, not 100,000 (each ~1 KB, and 500 B of JSON in every snapshot).

use super::{Finding, FindingState};
use crate::core::detect::Kind;
use crate::core::model::Timestamp;

/// Crash findings of one (uid, job) held each on its own; more fold into one.
pub const PER_JOB: usize = 8;
/// Held findings at most before crashes are counted per uid only (one finding per uid, so the
/// bound is this plus the number of local users).
pub const HELD_MAX: usize = 256;

/// What an aggregated finding counts the crashes of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    /// A (uid, job)'s crashes (or stops: the kind); the flag: those that followed another
    /// rank's failure (they fold apart from the rest, so a consequence never hides a cause, nor
    /// makes a warning critical). Stops fold apart from crashes for the same reason.
    Job(Option<u32>, Option<String>, bool, Kind),
    Uid(Option<u32>),
}

#[derive(Debug)]
pub struct Held {
    pub f: Finding,
    /// The crashed session's uid (SO_PEERCRED); None where the caller did not say.
    pub uid: Option<u32>,
    /// Set on an aggregated finding, with the count of crashes it stands for.
    pub group: Option<(Group, u64)>,
}

impl Held {
    /// A crash (or stop: `kind`) of `uid`'s `job` held on its own, a consequence or not as
    /// `consequence` says.
    pub fn of_job(
        &self,
        uid: Option<u32>,
        job: &Option<String>,
        consequence: bool,
        kind: Kind,
    ) -> bool {
        self.group.is_none()
            && self.f.kind == kind
            && self.f.consequence_of.is_some() == consequence
            && self.uid == uid
            && &self.f.subject.job == job
    }
}

/// A new aggregated finding for `group`, from the crash `f` (the latest) and the `n` crashes
/// it stands for, the oldest at `first_ts`.
pub fn aggregate(seq: u64, group: Group, mut f: Finding, n: u64, first_ts: Timestamp) -> Held {
    f.id = format!("crashes-{seq}");
    f.first_ts = first_ts;
    f.since = Some(first_ts);
    let mut h = Held {
        uid: match &group {
            Group::Job(uid, _, _, _) | Group::Uid(uid) => *uid,
        },
        f,
        group: Some((group, 0)),
    };
    h.f.subject.rank = None;
    if let Some((Group::Uid(_), _)) = &h.group {
        h.f.subject.job = None;
    }
    bump(&mut h, n, None);
    h
}

/// Adds `n` crashes to an aggregated finding, the latest being `latest` (None: keep the one it
/// names). Time moves on to the latest crash, so the hold lasts from there.
pub fn bump(h: &mut Held, n: u64, latest: Option<&Finding>) {
    let Some((group, count)) = &mut h.group else {
        return;
    };
    *count += n;
    if let Some(l) = latest {
        h.f.subject.session = l.subject.session.clone();
        h.f.subject.pid = l.subject.pid;
        h.f.subject.ns_pid = l.subject.ns_pid;
        if h.f.subject.gpu_uuid != l.subject.gpu_uuid {
            h.f.subject.gpu_uuid = None;
        }
        h.f.evidence = l.evidence.clone();
        h.f.updated_ts = l.updated_ts.max(h.f.updated_ts);
    }
    let how = match group {
        Group::Job(_, _, _, Kind::Stopped) => "were stopped by a signal",
        _ => "closed without bye",
    };
    let whose = match group {
        Group::Job(uid, job, consequence, _) => format!(
            "of job {} ({}){}",
            job.as_deref().unwrap_or("(none)"),
            uid_text(*uid),
            if *consequence {
                ", after another rank's failure,"
            } else {
                ""
            }
        ),
        Group::Uid(uid) => format!("of {}", uid_text(*uid)),
    };
    let secs = (h.f.updated_ts - h.f.first_ts).max(0.0);
    h.f.message = format!(
        "{count} sessions {whose} {how} in the last {secs:.0} s (the latest: {}); \
         counted as one finding",
        h.f.subject.session
    );
    h.f.evidence.detail = Some(format!("{count} sessions {how}"));
    h.f.state = FindingState::Firing;
}

fn uid_text(uid: Option<u32>) -> String {
    uid.map_or_else(|| "uid unknown".into(), |u| format!("uid {u}"))
}

/// Whether an update of an aggregate that now counts `n` goes to the alert sinks: at powers of
/// two, so a flood posts a few updates, not one per crash.
pub fn worth_posting(n: u64) -> bool {
    n.is_power_of_two()
}
