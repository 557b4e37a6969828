//! Jobs: the sessions of one training run (jobs.md). A session joins the job of its (`job`,
//! `run_id`, uid), the uid being its socket peer's, with no exception for root, so no local
//! user can put a failure into someone else's job nor take a failure out of it. Sessions without `run_id`
//! join a job of the same uid, `job` and `world_size` that still has a live session (their
//! lives overlap); a run that starts after every rank of the last one ended is a new job.
//!
//! The registry keeps what the verdict needs of each member (rank, when it ended, how it
//! failed) after the session store forgot the session, and it is bounded: `MAX_PER_UID` jobs a
//! uid, `ENDED_KEPT` ended jobs, `MAX_MEMBERS` sessions a job, `MAX_RECORDS` in all; past those
//! a session is not grouped (counted), and its own view stays whole.

pub mod identity;
pub mod merge;
pub mod text;
pub mod verdict;
pub mod view;

pub use crate::core::detect::findings::ConsequenceOf;
use crate::core::detect::Kind;
use crate::core::model::Timestamp;
use crate::core::trainer::Hello;
pub use identity::{Identity, RunKey};
pub use merge::merge;
pub use verdict::{Basis, Rules};
pub use view::{Failure, FirstFailure, JobState, JobView, Member, MemberFinding};

/// Jobs one uid may have at once (live, or ended and kept): a client that sends 10,000 run_ids
/// gets its first 64 grouped, and each ended one makes room.
pub const MAX_PER_UID: usize = 64;
/// Ended jobs kept for the API and the failure metrics, all uids together.
pub const ENDED_KEPT: usize = 32;
/// Sessions one job keeps on this node (its ranks here, and those that ended this attempt): a
/// node runs 8 ranks, 56 on MIG slices; a crash flood in one job stops here.
pub const MAX_MEMBERS: usize = 256;
/// Sessions all jobs keep together: what the API's `jobs` and the verdicts read stays bounded
/// (each member is a few hundred bytes of JSON) however many jobs clients make.
pub const MAX_RECORDS: usize = 1024;
/// What did not add up, kept per job.
const CONFLICTS_KEPT: usize = 16;

/// What the registry keeps of one member.
#[derive(Debug, Clone)]
pub struct Record {
    pub session: String,
    pub rank: Option<u64>,
    pub pid: u32,
    pub gpu_uuid: Option<String>,
    pub started: Timestamp,
    pub ended: Option<Timestamp>,
    pub failure: Option<Failure>,
    /// The findings firing on the session when it ended (a leak behind an OOM): the session
    /// store forgets them, and a dead job's verdict tells them with its failure.
    pub findings: Vec<MemberFinding>,
}

#[derive(Debug)]
pub struct Job {
    pub id: u64,
    pub uid: u32,
    pub job: String,
    pub run_id: Option<String>,
    pub world_size: Option<u64>,
    pub members: Vec<Record>,
    pub restarts: u64,
    /// The highest torchelastic restart count a member said.
    restart_count: u64,
    pub previous_failure: Option<FirstFailure>,
    pub conflicts: Vec<String>,
    /// The session whose failure is the cause now, when one failed.
    cause: Option<String>,
    pub last_change: Timestamp,
}

impl Job {
    pub fn identity(&self) -> Identity<'_> {
        Identity {
            job: &self.job,
            run_id: self.run_id.as_deref(),
            uid: Some(self.uid),
        }
    }

    pub fn live(&self) -> bool {
        self.members.iter().any(|m| m.ended.is_none())
    }

    /// The verdict's input, each member's facts filled in by `facts`.
    pub fn basis(&self, facts: impl Fn(&Record) -> Member) -> Basis {
        Basis {
            job: self.job.clone(),
            run_id: self.run_id.clone(),
            uid: Some(self.uid),
            world_size: self.world_size,
            restarts: self.restarts,
            previous_failure: self.previous_failure.clone(),
            conflicts: self.conflicts.clone(),
            members: self.members.iter().map(facts).collect(),
            skewed_hosts: Vec::new(),
        }
    }

    fn conflict(&mut self, c: String) {
        if self.conflicts.len() < CONFLICTS_KEPT {
            self.conflicts.push(c);
        }
    }
}

/// What a member's failure is, for its findings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Classified {
    /// Set when this failure followed another rank's within the cascade window.
    pub consequence_of: Option<ConsequenceOf>,
    /// Sessions whose failure was taken for the cause until this earlier one was known, and
    /// what they are the consequence of now.
    pub relabel: Vec<(String, ConsequenceOf)>,
}

#[derive(Debug, Default)]
pub struct Jobs {
    jobs: Vec<Job>,
    next_id: u64,
    rules: Rules,
    /// Sessions not grouped into a job because a bound was reached, since start.
    pub ungrouped: u64,
}

impl Jobs {
    pub fn new(rules: Rules) -> Self {
        Self {
            rules,
            ..Self::default()
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    pub fn iter(&self) -> impl Iterator<Item = &Job> {
        self.jobs.iter()
    }

    pub fn get(&self, id: u64) -> Option<&Job> {
        self.jobs.iter().find(|j| j.id == id)
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Job> {
        self.jobs.iter_mut().find(|j| j.id == id)
    }

    /// Puts a new session in its job; None when it has no job name or a bound was reached.
    pub fn join(
        &mut self,
        session: &str,
        pid: u32,
        uid: u32,
        h: &Hello,
        now: Timestamp,
    ) -> Option<u64> {
        let name = h.job.as_deref()?;
        let found = self.find(name, h.run_id.as_deref(), h.world_size, uid);
        let id = match found {
            Some(id) => id,
            None => self.create(name, h, uid, now)?,
        };
        let rules = self.rules;
        let records: usize = self.jobs.iter().map(|j| j.members.len()).sum();
        if records >= MAX_RECORDS && !self.make_room(uid, id) {
            self.ungrouped += 1;
            return None;
        }
        let job = self.get_mut(id)?;
        if job.members.len() >= MAX_MEMBERS {
            // A long run whose ranks reconnect: members that ended cleanly make room first.
            if let Some(i) = job
                .members
                .iter()
                .position(|m| m.ended.is_some() && m.failure.is_none())
            {
                job.members.remove(i);
            } else {
                self.ungrouped += 1;
                return None;
            }
        }
        restart(job, h.restart.unwrap_or(0), &rules);
        check(job, session, pid, h);
        job.world_size = job.world_size.or(h.world_size);
        job.members.push(Record {
            session: session.to_string(),
            rank: h.rank,
            pid,
            gpu_uuid: h.gpu_uuid.clone(),
            started: now,
            ended: None,
            failure: None,
            findings: Vec::new(),
        });
        job.last_change = now;
        Some(id)
    }

    fn find(&self, name: &str, run_id: Option<&str>, world: Option<u64>, uid: u32) -> Option<u64> {
        let me = Identity {
            job: name,
            run_id,
            uid: Some(uid),
        };
        self.jobs
            .iter()
            .rfind(|j| me.joins(world, &j.identity(), || j.live(), j.world_size))
            .map(|j| j.id)
    }

    /// Frees one record for a session of `uid` joining job `joining`, at `MAX_RECORDS`: the
    /// uid holding the most records gives one up (the joiner's own uid on a tie), so one user's
    /// hello-then-close flood costs only that user. False when that uid has nothing ended.
    fn make_room(&mut self, uid: u32, joining: u64) -> bool {
        let mut held: std::collections::BTreeMap<u32, usize> = Default::default();
        for j in &self.jobs {
            *held.entry(j.uid).or_default() += j.members.len();
        }
        let Some(hog) = held
            .iter()
            .max_by_key(|(u, n)| (**n, **u == uid))
            .map(|(u, _)| *u)
        else {
            return false;
        };
        self.evict(|j| j.uid == hog && j.id != joining) || self.drop_ended_member(hog)
    }

    /// Drops the longest-ended member of a job of `uid`: one that ended cleanly first, then a
    /// failed one that is not its job's cause (a crash flood's consequences).
    fn drop_ended_member(&mut self, uid: u32) -> bool {
        let mut best: Option<(bool, Timestamp, usize, usize)> = None;
        for (ji, j) in self.jobs.iter().enumerate().filter(|(_, j)| j.uid == uid) {
            for (mi, m) in j.members.iter().enumerate() {
                let Some(ended) = m.ended else { continue };
                if j.cause.as_deref() == Some(m.session.as_str()) {
                    continue;
                }
                let key = (m.failure.is_some(), ended, ji, mi);
                if best.is_none_or(|b| (key.0, key.1) < (b.0, b.1)) {
                    best = Some(key);
                }
            }
        }
        match best {
            Some((_, _, ji, mi)) => {
                self.jobs[ji].members.remove(mi);
                true
            }
            None => false,
        }
    }

    fn create(&mut self, name: &str, h: &Hello, uid: u32, now: Timestamp) -> Option<u64> {
        if self.jobs.iter().filter(|j| j.uid == uid).count() >= MAX_PER_UID
            && !self.evict(|j| j.uid == uid)
        {
            self.ungrouped += 1;
            return None;
        }
        self.next_id += 1;
        self.jobs.push(Job {
            id: self.next_id,
            uid,
            job: name.to_string(),
            run_id: h.run_id.clone(),
            world_size: h.world_size,
            members: Vec::new(),
            restarts: 0,
            restart_count: h.restart.unwrap_or(0),
            previous_failure: None,
            conflicts: Vec::new(),
            cause: None,
            last_change: now,
        });
        Some(self.next_id)
    }

    /// Drops the ended job of `which` that changed longest ago; false when every one is live.
    fn evict(&mut self, which: impl Fn(&Job) -> bool) -> bool {
        let oldest = self
            .jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| !j.live() && which(j))
            .min_by(|a, b| a.1.last_change.total_cmp(&b.1.last_change))
            .map(|(i, _)| i);
        match oldest {
            Some(i) => {
                self.jobs.remove(i);
                true
            }
            None => false,
        }
    }

    /// A member ended; with `failure` when it ended by one, and the findings that were firing
    /// on it then. Says whether that failure is the cause or a consequence, and which earlier
    /// verdicts it overturns.
    pub fn left(
        &mut self,
        id: u64,
        session: &str,
        now: Timestamp,
        failure: Option<Failure>,
        mut firing: Vec<MemberFinding>,
    ) -> Classified {
        let rules = self.rules;
        let Some(job) = self.get_mut(id) else {
            return Classified::default();
        };
        job.last_change = now;
        let failed = failure.is_some();
        if let Some(m) = job.members.iter_mut().find(|m| m.session == session) {
            m.ended = Some(now);
            m.failure = failure;
            // One per kind at most (a session has one finding of each): bounded by the kinds.
            firing.truncate(crate::core::detect::Kind::ALL.len());
            m.findings = firing;
        }
        let out = if failed {
            classify(job, session, &rules)
        } else {
            Classified::default()
        };
        while self.jobs.iter().filter(|j| !j.live()).count() > ENDED_KEPT {
            // The uid with the most ended jobs gives one up: another user's churn of short
            // runs cannot push a failed job out before its hold.
            let mut ended: std::collections::BTreeMap<u32, usize> = Default::default();
            for j in self.jobs.iter().filter(|j| !j.live()) {
                *ended.entry(j.uid).or_default() += 1;
            }
            let hog = ended.iter().max_by_key(|(_, n)| **n).map(|(u, _)| *u);
            if !self.evict(|j| Some(j.uid) == hog) {
                break;
            }
        }
        out
    }

    /// Failed ranks of every job whose failure is at most `hold` seconds old:
    /// `gpumon_job_rank_failed_timestamp_seconds`. A stop is no failure, nor is what followed
    /// it within the cascade window (the ranks its teardown took down): neither is listed.
    pub fn failed_ranks(&self, now: Timestamp, hold: f64) -> Vec<(&Job, &Record, &Failure)> {
        let rules = self.rules;
        let mut out = Vec::new();
        for j in &self.jobs {
            let recent = |m: &&Record| m.failure.as_ref().is_some_and(|f| now - f.ts < hold);
            if !j.members.iter().any(|m| recent(&m)) {
                continue;
            }
            let stopped = |m: &Record| m.failure.as_ref().is_some_and(|f| f.kind == Kind::Stopped);
            let after_stop: Vec<String> = if j.members.iter().any(stopped) {
                let v = verdict::verdict(j.basis(|r| bare(r, None)), &rules);
                match v.stop {
                    Some(_) => v.consequences.into_iter().map(|c| c.session).collect(),
                    None => Vec::new(),
                }
            } else {
                Vec::new()
            };
            for m in j.members.iter().filter(recent) {
                if stopped(m) || after_stop.contains(&m.session) {
                    continue;
                }
                if let Some(f) = m.failure.as_ref() {
                    out.push((j, m, f));
                }
            }
        }
        out
    }
}

/// A member of a job whose attempt failed, or whose restart count rose, starts the next
/// attempt: the failure becomes `previous_failure` and the ended members go.
fn restart(job: &mut Job, count: u64, rules: &Rules) {
    let failed = job.members.iter().any(|m| m.failure.is_some());
    let next = count > job.restart_count || (failed && !job.live());
    if !next || job.members.is_empty() {
        job.restart_count = job.restart_count.max(count);
        return;
    }
    let v = verdict::verdict(job.basis(|r| bare(r, None)), rules);
    job.previous_failure = v.first_failure.or(job.previous_failure.take());
    job.members.retain(|m| m.ended.is_none());
    job.restarts += 1;
    job.restart_count = job.restart_count.max(count);
    job.cause = None;
}

/// Notes what does not add up about a joining member.
fn check(job: &mut Job, session: &str, pid: u32, h: &Hello) {
    if let (Some(r), Some(w)) = (h.rank, h.world_size.or(job.world_size)) {
        if r >= w {
            job.conflict(format!("{session}: rank {r} is past world_size {w}"));
        }
    }
    if let (Some(w), Some(jw)) = (h.world_size, job.world_size) {
        if w != jw {
            job.conflict(format!("{session}: world_size {w}, the job's is {jw}"));
        }
    }
    let live_rank = |m: &&Record| m.ended.is_none() && m.rank.is_some() && m.rank == h.rank;
    // A process with several devices is one rank on several connections: said once.
    let again = job.members.iter().filter(live_rank).any(|m| m.pid == pid);
    let claimed = job
        .members
        .iter()
        .filter(live_rank)
        .find(|m| m.pid != pid)
        .filter(|_| !again);
    if let Some(m) = claimed {
        let r = m.rank.unwrap_or_default();
        let c = format!(
            "rank {r} claimed by two processes: {} (pid {}) and {session} (pid {pid})",
            m.session, m.pid
        );
        job.conflict(c);
    }
}

/// A member with only what the registry knows: for one that ended, the findings firing then.
pub fn bare(r: &Record, host: Option<&str>) -> Member {
    Member {
        session: r.session.clone(),
        rank: r.rank,
        host: host.map(str::to_string),
        file: None,
        pid: r.pid,
        gpu_uuid: r.gpu_uuid.clone(),
        started: r.started,
        ended: r.ended,
        failure: r.failure.clone(),
        peak_bytes: None,
        headroom_bytes: None,
        oom_eta_seconds: None,
        findings: r.findings.clone(),
        stray: Vec::new(),
    }
}

fn classify(job: &mut Job, session: &str, rules: &Rules) -> Classified {
    let v = verdict::verdict(job.basis(|r| bare(r, None)), rules);
    // A stop is the head of a stopped job's verdict as a failure is of a failed one's.
    let Some(first) = v.first_failure.or(v.stop) else {
        return Classified::default();
    };
    let of = ConsequenceOf {
        session: first.session.clone(),
        rank: first.rank,
        kind: first.kind,
        host: first.host.clone(),
    };
    let follows = |s: &str| v.consequences.iter().any(|c| c.session == s);
    let mut out = Classified::default();
    if follows(session) {
        out.consequence_of = Some(of.clone());
    }
    // The cause until now, overturned by an earlier failure read only now.
    if let Some(old) = job.cause.take().filter(|c| c != &first.session) {
        if follows(&old) {
            out.relabel.push((old, of));
        }
    }
    job.cause = Some(first.session);
    out
}

#[cfg(test)]
mod tests;
