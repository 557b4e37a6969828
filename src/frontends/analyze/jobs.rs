//! `gpumon analyze`'s `jobs`: the traces' sessions grouped by run, across every node whose
//! record directory was given, and judged by the daemon's own verdict (core::jobs). A trace is
//! one member, named by its file; its host comes from its `trace_host` line, its uid from its
//! `trace_peer` line (the daemon's reading of the socket, so traces of two users never merge).

use super::TraceReport;
use crate::core::apply::Core;
use crate::core::detect::{DetectConfig, Kind};
use crate::core::jobs::verdict::{verdict, Basis, Rules};
use crate::core::jobs::{bare, ConsequenceOf, JobView, Member};
use crate::core::snapshot::jobs::{facts as live_facts, ByPid};

/// A trace's session as its job's member.
#[derive(Debug, Clone)]
pub struct Facts {
    pub job: String,
    pub run_id: Option<String>,
    /// The trace's `trace_peer` uid: part of the job's identity, as live.
    pub uid: Option<u32>,
    pub world_size: Option<u64>,
    pub conflicts: Vec<String>,
    pub member: Member,
}

/// What the replay's core knows of the trace's one session and its job, after its close.
pub fn facts(core: &Core, report: &TraceReport) -> Option<Facts> {
    let sessions = core.sessions();
    let job = sessions.jobs.iter().next()?;
    let record = job.members.last()?;
    let mut member = bare(record, report.host.as_deref());
    if let Some(s) = sessions.get(&record.session) {
        live_facts(&mut member, s, record, &ByPid::default());
    }
    // Every replay's session is `s-1`: the file names it.
    member.session = report.file.clone();
    member.file = Some(report.file.clone());
    Some(Facts {
        job: job.job.clone(),
        run_id: job.run_id.clone(),
        uid: report.uid,
        world_size: job.world_size,
        conflicts: job.conflicts.clone(),
        member,
    })
}

/// Groups the traces into jobs, judges each, and marks each trace's crash that followed its
/// job's first failure with `consequence_of`. Traces without a run id are one job when their
/// job name and world size match and their lives overlap, as the daemon groups them.
pub fn judge(traces: &mut [TraceReport], cfg: DetectConfig) -> Vec<JobView> {
    let rules = Rules {
        cascade: cfg.job_cascade_seconds,
        ..Rules::default()
    };
    let mut facts: Vec<&Facts> = traces.iter().filter_map(|t| t.member.as_ref()).collect();
    facts.sort_by(|a, b| a.member.started.total_cmp(&b.member.started));
    let mut groups: Vec<Basis> = Vec::new();
    for f in facts {
        let joins = |b: &Basis| {
            b.job == f.job
                && b.run_id == f.run_id
                && b.uid == f.uid
                && (f.run_id.is_some()
                    || (b.world_size == f.world_size && overlaps(&b.members, &f.member)))
        };
        match groups.iter_mut().find(|b| joins(b)) {
            Some(b) => {
                b.members.push(f.member.clone());
                b.conflicts.extend(f.conflicts.iter().cloned());
            }
            None => groups.push(Basis {
                job: f.job.clone(),
                run_id: f.run_id.clone(),
                uid: f.uid,
                world_size: f.world_size,
                conflicts: f.conflicts.clone(),
                members: vec![f.member.clone()],
                ..Basis::default()
            }),
        }
    }
    let views: Vec<JobView> = groups.into_iter().map(|b| verdict(b, &rules)).collect();
    for v in &views {
        // A stopped job's stop heads its verdict as a failure heads a failed one's.
        let Some(first) = v.first_failure.as_ref().or(v.stop.as_ref()) else {
            continue;
        };
        let of = ConsequenceOf {
            session: first.session.clone(),
            rank: first.rank,
            kind: first.kind,
            host: first.host.clone(),
        };
        for c in &v.consequences {
            let Some(t) = traces.iter_mut().find(|t| t.file == c.session) else {
                continue;
            };
            let ends = t
                .findings
                .iter_mut()
                .filter(|f| matches!(f.kind, Kind::Crash | Kind::Stopped));
            for f in ends {
                f.consequence_of = Some(of.clone());
            }
        }
    }
    views
}

fn overlaps(members: &[Member], m: &Member) -> bool {
    let end = |x: &Member| x.ended.unwrap_or(f64::INFINITY);
    members
        .iter()
        .any(|x| x.started <= end(m) && m.started <= end(x))
}
