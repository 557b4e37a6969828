//! Several daemons' views of jobs as one (`gpumon tui --connect A B`, `gpumon analyze` over
//! record directories of several nodes): the members of one (`job`, `run_id`, uid) from every
//! host are judged together by the one verdict, so the first failure is the earliest on any
//! node and the cascade spans nodes. Jobs without a run id are not merged across hosts: nothing
//! says two nodes' `train.py` are one run. Nor are the ranks of different uids: a run whose
//! ranks run as root on one node and as a user on another is one job per uid, as Prometheus's
//! `by (job, run_id, uid)` sees it, so no user's failure is put into another's run.

use std::collections::BTreeMap;

use super::verdict::{verdict, Basis, Rules};
use super::{JobView, RunKey};

/// One view per job across `views` (each already carrying its members' hosts). `skewed_hosts`
/// are hosts whose clock was measured off by more than the tolerance. A run is judged with the
/// widest cascade window its daemons were judged with (`rules.cascade` when none says): a rank
/// on a node that waits out NCCL's timeout is a consequence there, so it is one here too.
pub fn merge(views: Vec<JobView>, skewed_hosts: &[String], rules: &Rules) -> Vec<JobView> {
    let mut cascade: BTreeMap<RunKey, f64> = BTreeMap::new();
    let mut by_run: BTreeMap<RunKey, Basis> = BTreeMap::new();
    let mut alone = Vec::new();
    for v in views {
        let Some(key) = v.identity().across_daemons() else {
            alone.push(v);
            continue;
        };
        if let Some(c) = v.cascade_seconds.filter(|c| c.is_finite() && *c >= 0.0) {
            let w = cascade.entry(key.clone()).or_insert(c);
            *w = w.max(c);
        }
        let b = by_run.entry(key).or_insert_with(|| Basis {
            job: v.job.clone(),
            run_id: v.run_id.clone(),
            uid: v.uid,
            skewed_hosts: skewed_hosts.to_vec(),
            ..Basis::default()
        });
        b.world_size = b.world_size.or(v.world_size);
        b.restarts = b.restarts.max(v.restarts);
        let earlier = match (&b.previous_failure, &v.previous_failure) {
            (Some(a), Some(x)) => x.ts < a.ts,
            (None, Some(_)) => true,
            _ => false,
        };
        if earlier {
            b.previous_failure = v.previous_failure.clone();
        }
        b.conflicts.extend(v.conflicts);
        b.members.extend(v.members);
    }
    let mut out: Vec<JobView> = by_run
        .into_iter()
        .map(|(key, b)| {
            let cascade = cascade.get(&key).copied().unwrap_or(rules.cascade);
            verdict(b, &Rules { cascade, ..*rules })
        })
        .collect();
    out.extend(alone);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::detect::Kind;
    use crate::core::jobs::view::{Failure, Member};

    fn node(host: &str, ranks: std::ops::Range<u64>, fail_at: Option<(u64, Kind, f64)>) -> JobView {
        let members = ranks
            .map(|r| Member {
                session: format!("{host}-s{r}"),
                rank: Some(r),
                host: Some(host.into()),
                file: None,
                pid: r as u32,
                gpu_uuid: None,
                started: 0.0,
                ended: fail_at.map(|f| f.2 + 0.1),
                failure: fail_at.map(|(first, kind, ts)| Failure {
                    kind: if r == first { kind } else { Kind::Crash },
                    ts: if r == first { ts } else { ts + 1.5 },
                    step: None,
                    message: String::new(),
                    exception: None,
                    signal: None,
                }),
                peak_bytes: Some(r << 30),
                headroom_bytes: None,
                oom_eta_seconds: None,
                findings: Vec::new(),
                stray: Vec::new(),
            })
            .collect();
        verdict(
            Basis {
                job: "llama".into(),
                run_id: Some("r1".into()),
                world_size: Some(8),
                members,
                ..Basis::default()
            },
            &Rules::default(),
        )
    }

    #[test]
    fn two_nodes_are_one_job_and_the_earliest_failure_on_either_is_the_cause() {
        // Node b's daemon saw only crashes (rank 4 first, at 101.4): on its own it blames rank 4.
        let a = node("a", 0..4, Some((3, Kind::Oom, 100.0)));
        let b = node("b", 4..8, Some((4, Kind::Crash, 99.9 + 1.5)));
        assert_eq!(b.first_failure.as_ref().unwrap().rank, Some(4));
        let m = merge(vec![a, b], &[], &Rules::default());
        assert_eq!(m.len(), 1);
        let j = &m[0];
        assert_eq!(j.ranks, (0..8).collect::<Vec<_>>());
        assert_eq!(j.hosts, vec!["a".to_string(), "b".to_string()]);
        let f = j.first_failure.as_ref().unwrap();
        assert_eq!(
            (f.rank, f.kind, f.host.as_deref()),
            (Some(3), Kind::Oom, Some("a"))
        );
        assert_eq!(j.consequences.len(), 7);
        assert_eq!(j.memory.peak_max_rank, Some(7));
    }

    #[test]
    fn a_skewed_clock_says_order_unknown_rather_than_guessing() {
        let a = node("a", 0..4, Some((3, Kind::Oom, 100.0)));
        let b = node("b", 4..8, Some((4, Kind::Crash, 99.9 + 1.5)));
        let m = merge(vec![a, b], &["b".to_string()], &Rules::default());
        let f = m[0].first_failure.as_ref().unwrap();
        assert_eq!(f.order_unknown, (4..8).collect::<Vec<_>>());
    }

    #[test]
    fn one_run_id_under_two_uids_is_two_jobs_each_with_its_own_cause() {
        // Node a runs ranks 0-3 as uid 1000, node b ranks 4-7 as root; b's rank 4 crashed
        // first. Across uids nothing is merged: a's OOM stays a's cause, b's crash b's.
        let mut a = node("a", 0..4, Some((3, Kind::Oom, 100.0)));
        let mut b = node("b", 4..8, Some((4, Kind::Crash, 99.0)));
        a.uid = Some(1000);
        b.uid = Some(0);
        let m = merge(vec![a, b], &[], &Rules::default());
        assert_eq!(m.len(), 2, "{m:#?}");
        let by_uid = |u: u32| m.iter().find(|j| j.uid == Some(u)).unwrap();
        let (a, b) = (by_uid(1000), by_uid(0));
        assert_eq!(a.ranks, vec![0, 1, 2, 3]);
        assert_eq!(b.ranks, vec![4, 5, 6, 7]);
        let fa = a.first_failure.as_ref().unwrap();
        assert_eq!((fa.rank, fa.kind), (Some(3), Kind::Oom));
        let fb = b.first_failure.as_ref().unwrap();
        assert_eq!((fb.rank, fb.kind), (Some(4), Kind::Crash));
        assert_ne!(a.name(), b.name());
        // The same uid on both nodes is one job, as before.
        let mut c = node("a", 0..4, Some((3, Kind::Oom, 100.0)));
        let mut d = node("b", 4..8, Some((4, Kind::Crash, 99.0)));
        c.uid = Some(1000);
        d.uid = Some(1000);
        let one = merge(vec![c, d], &[], &Rules::default());
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].uid, Some(1000));
    }

    #[test]
    fn runs_without_an_id_stay_apart() {
        let mut a = node("a", 0..4, None);
        let mut b = node("b", 4..8, None);
        a.run_id = None;
        b.run_id = None;
        assert_eq!(merge(vec![a, b], &[], &Rules::default()).len(), 2);
    }

    #[test]
    fn the_daemons_cascade_window_is_used_not_the_mergers_default() {
        // NCCL's watchdog tore rank 4 down 600 s after rank 3's OOM; the daemons were set to
        // `detect.job_cascade = "15m"`.
        let mut a = node("a", 0..4, Some((3, Kind::Oom, 100.0)));
        let mut b = node("b", 4..8, Some((4, Kind::Crash, 700.0)));
        assert_eq!(a.cascade_seconds, Some(60.0));
        let plain = merge(vec![a.clone(), b.clone()], &[], &Rules::default());
        assert!(!plain[0].other_failures.is_empty());
        let late = plain[0].other_failures.len();
        a.cascade_seconds = Some(900.0);
        b.cascade_seconds = Some(900.0);
        let m = merge(vec![a, b], &[], &Rules::default());
        assert!(m[0].other_failures.is_empty());
        assert_eq!(m[0].consequences.len(), plain[0].consequences.len() + late);
        assert_eq!(m[0].cascade_seconds, Some(900.0));
    }
}
