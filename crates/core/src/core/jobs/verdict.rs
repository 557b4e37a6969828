//! The one rule that judges a job from its members' facts: the first failure is the cause, the
//! failures within the cascade window after it are its consequences, one finding kind on many
//! ranks is one finding, and the job's memory is its ranks' spread. Pure: the live registry,
//! `gpumon analyze` and a merge of several daemons' views call it alike.

use std::collections::BTreeMap;

use super::view::{
    who, FailureRef, FirstFailure, JobFinding, JobMemory, JobState, JobView, Member, StrayRank,
};
use crate::core::detect::Kind;

/// How failures are ordered and grouped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    /// Seconds after the first failure within which another rank's failure is its consequence
    /// (`detect.job_cascade`).
    pub cascade: f64,
    /// How far apart two hosts' clocks may be and still order failures (NTP on one network
    /// keeps them within milliseconds; this leaves room for a poorly synced node).
    pub tolerance: f64,
}

/// Clocks on different hosts are trusted to order failures this far apart, and no closer.
pub const CLOCK_TOLERANCE_SECONDS: f64 = 0.5;
/// The cascade window when the config does not set one (`detect.job_cascade`).
pub const DEFAULT_CASCADE_SECONDS: f64 = crate::core::detect::DEFAULT_JOB_CASCADE_SECONDS;

impl Default for Rules {
    fn default() -> Self {
        Self {
            cascade: DEFAULT_CASCADE_SECONDS,
            tolerance: CLOCK_TOLERANCE_SECONDS,
        }
    }
}

impl Rules {
    /// The rules a detection config sets (its cascade window), the clock tolerance as ever.
    pub fn of(cfg: &crate::core::detect::DetectConfig) -> Self {
        Self {
            cascade: cfg.job_cascade_seconds,
            ..Self::default()
        }
    }
}

/// What a job is besides its members' facts.
#[derive(Debug, Clone, Default)]
pub struct Basis {
    pub job: String,
    pub run_id: Option<String>,
    /// Whose job it is: the uid of its sessions' socket peer (none: a trace recorded before
    /// traces said it).
    pub uid: Option<u32>,
    pub world_size: Option<u64>,
    pub restarts: u64,
    pub previous_failure: Option<FirstFailure>,
    pub conflicts: Vec<String>,
    pub members: Vec<Member>,
    /// Hosts whose clock was measured off by more than the tolerance: their failures cannot be
    /// ordered against another host's.
    pub skewed_hosts: Vec<String>,
}

pub fn verdict(b: Basis, rules: &Rules) -> JobView {
    let mut ranks: Vec<u64> = b.members.iter().filter_map(|m| m.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut hosts: Vec<String> = b.members.iter().filter_map(|m| m.host.clone()).collect();
    hosts.sort();
    hosts.dedup();
    let (head, consequences, other_failures) = failures(&b, rules);
    let live = b.members.iter().any(|m| m.ended.is_none());
    let (first_failure, stop) = match head {
        Some(h) if h.kind == Kind::Stopped => (None, Some(h)),
        h => (h, None),
    };
    let state = match (&first_failure, &stop, live) {
        (Some(_), _, _) => JobState::Failed,
        (None, Some(_), _) => JobState::Stopped,
        (None, None, true) => JobState::Running,
        (None, None, false) => JobState::Ended,
    };
    let n = b
        .world_size
        .unwrap_or(ranks.len() as u64)
        .max(ranks.len() as u64);
    let memory = memory(&b.members);
    let oom_eta_seconds = b
        .members
        .iter()
        .filter(|m| m.ended.is_none())
        .filter_map(|m| m.oom_eta_seconds)
        .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.min(x))));
    let at_failure = first_failure.as_ref().map_or_else(Vec::new, |f| {
        // Ranks that ended before the failure (beyond clock tolerance) tell nothing of it.
        let at = |m: &&Member| m.ended.is_none_or(|e| e >= f.ts - rules.tolerance);
        findings(b.members.iter().filter(at), n)
    });
    JobView {
        findings: findings(b.members.iter().filter(|m| m.ended.is_none()), n),
        findings_at_failure: at_failure,
        sessions: b.members.iter().map(|m| m.session.clone()).collect(),
        job: b.job,
        run_id: b.run_id,
        uid: b.uid,
        world_size: b.world_size,
        ranks,
        hosts,
        state,
        first_failure,
        stop,
        consequences,
        other_failures,
        memory,
        oom_eta_seconds,
        restarts: b.restarts,
        previous_failure: b.previous_failure,
        conflicts: b.conflicts,
        members: b.members,
        cascade_seconds: Some(rules.cascade),
    }
}

type Verdict = (Option<FirstFailure>, Vec<FailureRef>, Vec<FailureRef>);

/// The head of the verdict: the first failure, or the first stop when the job was stopped
/// (a stop before any failure, and no failure past its cascade window); then the ends that
/// followed it within the window, and the failures past it.
fn failures(b: &Basis, rules: &Rules) -> Verdict {
    let mut ended: Vec<&Member> = b.members.iter().filter(|m| m.failure.is_some()).collect();
    ended.sort_by(|x, y| {
        let (fx, fy) = (x.failure.as_ref(), y.failure.as_ref());
        let tx = fx.map_or(f64::INFINITY, |f| f.ts);
        let ty = fy.map_or(f64::INFINITY, |f| f.ts);
        // An OOM before a crash at the same instant: the OOM is what the crash followed; a
        // failure before a stop: the stop may be its teardown.
        tx.total_cmp(&ty)
            .then_with(|| kind_order(fx).cmp(&kind_order(fy)))
            .then_with(|| x.rank.cmp(&y.rank))
    });
    let stopped = |m: &&&Member| m.failure.as_ref().is_some_and(|f| f.kind == Kind::Stopped);
    let first_stop = ended.iter().find(stopped).copied();
    let first_fail = ended.iter().find(|m| !stopped(m)).copied();
    let ts = |m: &Member| m.failure.as_ref().map_or(f64::INFINITY, |f| f.ts);
    let head = match (first_stop, first_fail) {
        // A failure that came within the window after a stop is the stop's teardown.
        (Some(s), Some(f)) if ts(f) - ts(s) > rules.cascade || ts(f) < ts(s) => Some(f),
        (Some(s), _) => Some(s),
        (None, f) => f,
    };
    let Some(head) = head else {
        return (None, Vec::new(), Vec::new());
    };
    let Some(hf) = head.failure.as_ref() else {
        return (None, Vec::new(), Vec::new());
    };
    let skewed = |h: &Option<String>| h.as_ref().is_some_and(|h| b.skewed_hosts.contains(h));
    let mut first = FirstFailure {
        rank: head.rank,
        session: head.session.clone(),
        kind: hf.kind,
        ts: hf.ts,
        step: hf.step,
        message: hf.message.clone(),
        exception: hf.exception.clone(),
        signal: hf.signal.clone(),
        host: head.host.clone(),
        file: head.file.clone(),
        order_unknown: Vec::new(),
    };
    let (mut follow, mut other) = (Vec::new(), Vec::new());
    // A member is its session on its host: two daemons can give one id (merge.rs).
    let is_head = |m: &Member| m.session == head.session && m.host == head.host;
    for m in ended.iter().filter(|m| !is_head(m)) {
        let Some(f) = m.failure.as_ref() else {
            continue;
        };
        let after = f.ts - hf.ts;
        let stop = f.kind == Kind::Stopped;
        // Before the head: a stop ahead of a failure past its window (not this verdict's).
        if after < 0.0 && (stop || hf.kind == Kind::Stopped) {
            continue;
        }
        let other_host = m.host != head.host;
        if other_host
            && !stop
            && after <= rules.cascade
            && (after <= rules.tolerance || skewed(&m.host) || skewed(&head.host))
        {
            first.order_unknown.extend(m.rank);
        }
        let r = FailureRef {
            rank: m.rank,
            session: m.session.clone(),
            kind: f.kind,
            ts: f.ts,
            after_seconds: after,
            host: m.host.clone(),
            file: m.file.clone(),
        };
        if after <= rules.cascade {
            follow.push(r);
        } else if !stop {
            // A stop long after is no failure to explain.
            other.push(r);
        }
    }
    (Some(first), follow, other)
}

fn kind_order(f: Option<&super::view::Failure>) -> u8 {
    match f.map(|f| f.kind) {
        Some(Kind::Oom) => 0,
        Some(Kind::Stopped) => 2,
        _ => 1,
    }
}

/// One finding per kind, naming its ranks; crashes and stops are the verdict's, not listed here.
fn findings<'a>(members: impl Iterator<Item = &'a Member>, n: u64) -> Vec<JobFinding> {
    let mut by_kind: BTreeMap<Kind, Vec<(Option<u64>, &str)>> = BTreeMap::new();
    for m in members {
        for f in &m.findings {
            if !matches!(f.kind, Kind::Crash | Kind::Stopped) {
                by_kind
                    .entry(f.kind)
                    .or_default()
                    .push((m.rank, f.message.as_str()));
            }
        }
    }
    by_kind
        .into_iter()
        .map(|(kind, mut hits)| {
            hits.sort_by_key(|(r, _)| *r);
            let mut ranks: Vec<u64> = hits.iter().filter_map(|(r, _)| *r).collect();
            ranks.dedup();
            let k = hits.len().max(ranks.len()) as u64;
            let message = format!(
                "{kind} on {k} of {} ranks ({}): {}",
                n.max(k),
                ranks_text(&ranks),
                hits.first().map_or("", |(_, m)| m)
            );
            JobFinding {
                kind,
                ranks,
                message,
            }
        })
        .collect()
}

fn memory(members: &[Member]) -> JobMemory {
    let mut peaks: Vec<(u64, Option<u64>)> = members
        .iter()
        .filter_map(|m| m.peak_bytes.map(|p| (p, m.rank)))
        .collect();
    peaks.sort_by_key(|(p, r)| (*p, std::cmp::Reverse(*r)));
    let live = || members.iter().filter(|m| m.ended.is_none());
    let headroom = live()
        .filter_map(|m| m.headroom_bytes.map(|h| (h, m.rank)))
        .min_by_key(|(h, r)| (*h, *r));
    let eta = live()
        .filter_map(|m| m.oom_eta_seconds.map(|e| (e, m.rank)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let stray = members
        .iter()
        .flat_map(|m| {
            m.stray.iter().map(|s| StrayRank {
                rank: m.rank,
                session: m.session.clone(),
                stray: s.clone(),
            })
        })
        .collect();
    JobMemory {
        peak_min_bytes: peaks.first().map(|p| p.0),
        peak_median_bytes: (!peaks.is_empty()).then(|| peaks[peaks.len() / 2].0),
        peak_max_bytes: peaks.last().map(|p| p.0),
        peak_max_rank: peaks.last().and_then(|p| p.1),
        spread_bytes: peaks.first().zip(peaks.last()).map(|(lo, hi)| hi.0 - lo.0),
        headroom_bytes: headroom.map(|h| h.0),
        headroom_rank: headroom.and_then(|h| h.1),
        oom_eta_rank: eta.and_then(|e| e.1),
        stray,
    }
}

/// Ranks as a person writes them: `0-7`, `0-3,5,7`.
pub fn ranks_text(ranks: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j > i + 1 {
            format!("{}-{}", ranks[i], ranks[j])
        } else if j == i + 1 {
            format!("{},{}", ranks[i], ranks[j])
        } else {
            ranks[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// The job's verdict in one line: `failed: rank 5 oom at step 812, then 7 ranks within 1.5 s`,
/// `failed: rank 0 crash (RuntimeError: boom) ...`, `stopped: rank 0 by SIGINT at step 40`.
pub fn summary(v: &JobView) -> String {
    // The story in order: what was firing on the ranks, then the failure it led to.
    let before: Vec<String> = v
        .findings_at_failure
        .iter()
        .map(|j| {
            let n = v.world_size.unwrap_or(0).max(v.ranks.len() as u64);
            let k = j.ranks.len().max(1) as u64;
            format!("{} on {k} of {} ranks", j.kind, n.max(k))
        })
        .collect();
    let (f, mut s) = match (&v.first_failure, &v.stop) {
        (Some(f), _) => {
            let mut s = String::from("failed: ");
            if !before.is_empty() {
                s.push_str(&before.join(", "));
                s.push_str(", then ");
            }
            s.push_str(&format!("{} {}", who(f.rank, &f.session), f.kind));
            if let Some(x) = &f.exception {
                s.push_str(&format!(" ({x})"));
            }
            (f, s)
        }
        (None, Some(f)) => {
            let by = f.signal.as_deref().unwrap_or("a signal");
            (f, format!("stopped: {} by {by}", who(f.rank, &f.session)))
        }
        (None, None) => return v.state.as_str().to_string(),
    };
    if let Some(h) = &f.host {
        s.push_str(&format!(" on {h}"));
    }
    if let Some(step) = f.step {
        s.push_str(&format!(" at step {step}"));
    }
    if !f.order_unknown.is_empty() {
        s.push_str(&format!(
            " (order unknown against ranks {}: clocks)",
            ranks_text(&f.order_unknown)
        ));
    }
    if let Some(last) = v.consequences.last() {
        let n = v.consequences.len();
        let ranks = if n == 1 { "rank" } else { "ranks" };
        s.push_str(&format!(
            ", then {n} {ranks} within {:.1} s",
            last.after_seconds.max(0.0)
        ));
    }
    s
}

#[cfg(test)]
mod tests;
