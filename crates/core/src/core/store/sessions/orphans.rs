//! Orphaned memory with what the daemon knew of each process: the trainer session it ran, live,
//! ended (kept a while) or remembered by the jobs registry after the store forgot it.

use super::{nvml::joins, Session, Sessions};
use crate::core::detect::orphan::{Known, Orphans};
use crate::core::jobs::Jobs;
use crate::core::model::{NodeReading, ProcView, ProcessReading};

impl Sessions {
    /// A poll, for `orphans` (the store's, detect/orphan.rs), told what the sessions and
    /// `jobs` knew of each process; `view` is the source's view of /proc.
    pub fn orphans_polled(
        &mut self,
        jobs: &Jobs,
        orphans: &mut Orphans,
        r: &NodeReading,
        view: Option<ProcView>,
    ) {
        let grace = self.detect.orphan_grace_seconds;
        let (live, ended) = (&self.live, &self.ended);
        let known = |p: &ProcessReading| known(live.values().chain(ended.iter()), jobs, p);
        orphans.poll(r, view, grace, &known, &mut self.findings);
    }
}

/// What gpumon knew of `p`'s process: its newest session of that pid among `sessions` (one on
/// `p`'s GPU first), else the jobs registry's newest record of it (on `p`'s GPU first).
fn known<'a>(
    sessions: impl Iterator<Item = &'a Session>,
    jobs: &Jobs,
    p: &ProcessReading,
) -> Known {
    let newest = |a: &&&Session, b: &&&Session| a.started.total_cmp(&b.started);
    let of_pid: Vec<&Session> = sessions.filter(|s| s.peer.pid == p.pid).collect();
    let session = of_pid
        .iter()
        .filter(|s| joins(s, p))
        .max_by(newest)
        .or_else(|| of_pid.iter().max_by(newest));
    if let Some(s) = session {
        return Known {
            session: Some(s.id.clone()),
            job: s.hello.job.clone(),
            run_id: s.hello.run_id.clone(),
            rank: s.hello.rank,
            ns_pid: s.hello.ns_pid,
            ended: s.ended.map(|(t, _)| t),
        };
    }
    let on_gpu = |g: &Option<String>| {
        g.as_deref()
            .is_some_and(|u| u == &*p.uuid || p.mig_uuid.as_deref() == Some(u))
    };
    let record = jobs
        .iter()
        .flat_map(|j| j.members.iter().map(move |m| (j, m)))
        .filter(|(_, m)| m.pid == p.pid)
        .max_by(|(_, a), (_, b)| {
            on_gpu(&a.gpu_uuid)
                .cmp(&on_gpu(&b.gpu_uuid))
                .then(a.started.total_cmp(&b.started))
        });
    match record {
        Some((j, m)) => Known {
            session: Some(m.session.clone()),
            job: Some(j.job.clone()),
            run_id: j.run_id.clone(),
            rank: m.rank,
            ns_pid: None,
            ended: m.ended,
        },
        None => Known::default(),
    }
}

#[cfg(test)]
mod tests;
