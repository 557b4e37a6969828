//! The snapshot's `jobs`: each job of the registry judged now, its members' facts read from
//! their sessions (the step peak, headroom, forecast, firing findings) and from NVML (memory
//! their process holds on a GPU not their own).

use std::collections::HashMap;

use crate::core::detect::{FindingState, Kind};
use crate::core::jobs::view::{MemberFinding, Stray};
use crate::core::jobs::{bare, verdict, JobView, Member, Record};
use crate::core::model::NodeReading;
use crate::core::store::sessions::Session;
use crate::core::store::Store;

/// Every job the registry keeps, newest first: live ones, then ended ones.
pub fn views(store: &Store, hostname: &str) -> Vec<JobView> {
    views_named(store, hostname, |_| {})
}

/// `views`, with each member named by `name` before its job is judged (`gpumon analyze` names
/// a member by its trace file, which the verdict then carries into its failures).
pub fn views_named(store: &Store, hostname: &str, name: impl Fn(&mut Member)) -> Vec<JobView> {
    let sessions = &store.sessions;
    // Only the live members' pids: a node lists a thousand processes, a job's ranks a handful,
    // and this runs for every API answer.
    let mut pids: Vec<u32> = store
        .jobs
        .iter()
        .flat_map(|j| &j.members)
        .filter(|m| m.ended.is_none())
        .map(|m| m.pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    let by_pid = match store.latest() {
        Some(r) if !pids.is_empty() => by_pid(r, &pids),
        _ => ByPid::default(),
    };
    let rules = *store.jobs.rules();
    let mut out: Vec<JobView> = store
        .jobs
        .iter()
        .map(|j| {
            let basis = j.basis(|r| {
                let mut m = bare(r, Some(hostname));
                if let Some(s) = sessions.get(&r.session) {
                    facts(&mut m, s, r, &by_pid);
                }
                name(&mut m);
                m
            });
            verdict::verdict(basis, &rules)
        })
        .collect();
    // Running first, then by name: a stable order for the TUI and `status`.
    out.sort_by(|a, b| {
        let live = |v: &JobView| v.members.iter().all(|m| m.ended.is_some());
        live(a)
            .cmp(&live(b))
            .then_with(|| a.job.cmp(&b.job))
            .then_with(|| a.run_id.cmp(&b.run_id))
            .then_with(|| a.uid.cmp(&b.uid))
    });
    out
}

/// Memory each pid holds on each GPU, from NVML: (device UUID, index, bytes).
pub type ByPid<'a> = HashMap<u32, Vec<(&'a str, Option<u32>, u64)>>;

/// NVML's rows of `pids` (sorted), by pid.
fn by_pid<'a>(r: &'a NodeReading, pids: &[u32]) -> ByPid<'a> {
    let mut m: ByPid = HashMap::with_capacity(pids.len());
    for p in &r.processes {
        if pids.binary_search(&p.pid).is_err() {
            continue;
        }
        if let Some(used) = p.used_memory_bytes.filter(|u| *u > 0) {
            let uuid = p.mig_uuid.as_deref().unwrap_or(&p.uuid);
            m.entry(p.pid).or_default().push((uuid, Some(p.gpu), used));
        }
    }
    m
}

/// Fills in what `s` says of member `m` now: its step peak and headroom, and while it is live
/// its forecast, firing findings and memory on GPUs not its own.
pub fn facts(m: &mut Member, s: &Session, r: &Record, by_pid: &ByPid) {
    let last = s.last_sample.as_ref().map(|(_, x)| x);
    let st = last.map(|x| x.stats);
    m.peak_bytes = st.and_then(|st| st.allocated_peak.or(st.allocated));
    if let (Some(x), Some(peak)) = (last, m.peak_bytes) {
        let limit = x.allocator_limit(s.alloc_limit);
        m.headroom_bytes = limit.map(|l| l as i64 - peak as i64);
    }
    if s.ended.is_none() {
        m.oom_eta_seconds = s
            .detect
            .firing(Kind::Leak)
            .and_then(|f| f.evidence.oom_eta_seconds);
        m.findings = s
            .detect
            .current()
            .filter(|f| f.state == FindingState::Firing)
            .map(|f| MemberFinding {
                kind: f.kind,
                message: f.message.clone(),
            })
            .collect();
        let own = r.gpu_uuid.as_deref();
        m.stray = by_pid
            .get(&s.peer.pid)
            .into_iter()
            .flatten()
            .filter(|(uuid, _, _)| own.is_some_and(|o| o != *uuid))
            .map(|(uuid, gpu, bytes)| Stray {
                gpu_uuid: uuid.to_string(),
                gpu: *gpu,
                bytes: *bytes,
            })
            .collect();
    }
}
