use super::*;
use crate::core::detect::Kind;

fn hello(job: &str, run: Option<&str>, rank: u64, world: u64) -> Hello {
    Hello {
        v: 1,
        job: Some(job.into()),
        run_id: run.map(Into::into),
        rank: Some(rank),
        world_size: Some(world),
        ..Hello::default()
    }
}

fn crash(ts: f64) -> Option<Failure> {
    Some(Failure {
        kind: Kind::Crash,
        ts,
        step: None,
        message: "crash".into(),
        exception: None,
        signal: None,
    })
}

fn oom(ts: f64) -> Option<Failure> {
    Some(Failure {
        kind: Kind::Oom,
        ts,
        step: Some(7),
        message: "oom".into(),
        exception: None,
        signal: None,
    })
}

#[test]
fn ranks_of_one_run_are_one_job_and_two_runs_never_merge() {
    let mut j = Jobs::default();
    let a: Vec<_> = (0..4)
        .map(|r| {
            j.join(
                &format!("s-{r}"),
                10 + r as u32,
                1000,
                &hello("llama", Some("r1"), r, 4),
                1.0,
            )
        })
        .collect();
    assert!(a.iter().all(|x| *x == a[0] && x.is_some()));
    let b = j.join("s-9", 99, 1000, &hello("llama", Some("r2"), 0, 4), 1.0);
    assert_ne!(a[0], b);
    // Another user's session with the same job and run is not let in; root's is.
    let other = j.join("s-10", 98, 1001, &hello("llama", Some("r1"), 1, 4), 1.0);
    assert_ne!(other, a[0]);
    let root = j.join("s-11", 97, 0, &hello("llama", Some("r1"), 1, 4), 1.0);
    assert_eq!(root, a[0]);
    // No job name: no job.
    let mut h = hello("x", None, 0, 1);
    h.job = None;
    assert_eq!(j.join("s-12", 1, 1000, &h, 1.0), None);
}

#[test]
fn without_run_id_only_overlapping_lives_group() {
    let mut j = Jobs::default();
    let a = j
        .join("s-1", 1, 1000, &hello("bert", None, 0, 2), 1.0)
        .unwrap();
    let b = j
        .join("s-2", 2, 1000, &hello("bert", None, 1, 2), 1.0)
        .unwrap();
    assert_eq!(a, b);
    // A different world size is another run.
    let c = j
        .join("s-3", 3, 1000, &hello("bert", None, 0, 4), 1.0)
        .unwrap();
    assert_ne!(a, c);
    j.left(a, "s-1", 2.0, None);
    j.left(a, "s-2", 2.0, None);
    // Every rank ended: the next run of bert is a new job.
    let d = j
        .join("s-4", 4, 1000, &hello("bert", None, 0, 2), 3.0)
        .unwrap();
    assert_ne!(a, d);
}

#[test]
fn followers_are_consequences_and_an_earlier_failure_read_late_overturns_the_cause() {
    let mut j = Jobs::default();
    let ids: Vec<_> = (0..4)
        .map(|r| {
            j.join(
                &format!("s-{r}"),
                r as u32,
                1000,
                &hello("llama", Some("r1"), r, 4),
                1.0,
            )
        })
        .collect();
    let id = ids[3].unwrap();
    assert!(ids.iter().all(|x| *x == Some(id)));
    // Rank 1's crash is read first, at 101.5: the cause for now.
    let c1 = j.left(id, "s-1", 101.5, crash(101.5));
    assert_eq!(c1, Classified::default());
    // Rank 3's OOM happened at 100.0 but its close is read after: it is the cause, and rank 1
    // is relabelled as its consequence.
    let c3 = j.left(id, "s-3", 101.6, oom(100.0));
    assert_eq!(c3.consequence_of, None);
    assert_eq!(c3.relabel.len(), 1);
    assert_eq!(c3.relabel[0].0, "s-1");
    assert_eq!(
        (c3.relabel[0].1.rank, c3.relabel[0].1.kind),
        (Some(3), Kind::Oom)
    );
    let c0 = j.left(id, "s-0", 101.7, crash(101.7));
    assert_eq!(c0.consequence_of.map(|c| c.session), Some("s-3".into()));
    // A clean exit is no failure.
    assert_eq!(j.left(id, "s-2", 101.8, None), Classified::default());
    let failed: Vec<_> = j
        .failed_ranks(102.0, 600.0)
        .into_iter()
        .map(|(_, m, _)| m.rank)
        .collect();
    assert_eq!(failed.len(), 3);
    assert_eq!(j.failed_ranks(102.0 + 600.0, 600.0).len(), 0);
}

#[test]
fn a_restart_starts_the_next_attempt_and_keeps_the_failure_that_ended_the_last() {
    let mut j = Jobs::default();
    let id = j
        .join("s-0", 1, 1000, &hello("llama", Some("r1"), 0, 2), 1.0)
        .unwrap();
    j.join("s-1", 2, 1000, &hello("llama", Some("r1"), 1, 2), 1.0);
    j.left(id, "s-0", 10.0, oom(10.0));
    j.left(id, "s-1", 11.0, crash(11.0));
    let mut h = hello("llama", Some("r1"), 0, 2);
    h.restart = Some(1);
    assert_eq!(j.join("s-2", 3, 1000, &h, 20.0), Some(id));
    let job = j.get(id).unwrap();
    assert_eq!(job.restarts, 1);
    assert_eq!(job.previous_failure.as_ref().map(|f| f.rank), Some(Some(0)));
    assert_eq!(job.members.len(), 1);
    let v = verdict::verdict(job.basis(|r| bare(r, None)), j.rules());
    assert_eq!(v.state, JobState::Running);
    assert!(v.first_failure.is_none());
}

#[test]
fn conflicts_are_named_not_trusted() {
    let mut j = Jobs::default();
    let id = j
        .join("s-0", 1, 1000, &hello("llama", Some("r"), 9, 8), 1.0)
        .unwrap();
    j.join("s-1", 2, 1000, &hello("llama", Some("r"), 3, 8), 1.0);
    j.join("s-2", 3, 1000, &hello("llama", Some("r"), 3, 8), 1.0);
    // One process with two devices is one rank on two connections: no conflict.
    j.join("s-3", 3, 1000, &hello("llama", Some("r"), 3, 8), 1.0);
    j.join("s-4", 4, 1000, &hello("llama", Some("r"), 4, 16), 1.0);
    let c = &j.get(id).unwrap().conflicts;
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(c[0].contains("rank 9 is past world_size 8"));
    assert!(c[1].contains("rank 3 claimed by two processes"));
    assert!(c[2].contains("world_size 16, the job's is 8"));
}

#[test]
fn ten_thousand_run_ids_from_one_uid_stay_bounded() {
    let mut j = Jobs::default();
    let mut grouped = 0;
    for i in 0..10_000u64 {
        let run = format!("run-{i}");
        if j.join(
            &format!("s-{i}"),
            1,
            1000,
            &hello("x", Some(&run), 0, 1),
            i as f64,
        )
        .is_some()
        {
            grouped += 1;
        }
    }
    // All live: the first MAX_PER_UID are grouped, the rest counted.
    assert_eq!(grouped, MAX_PER_UID);
    assert_eq!(j.ungrouped, 10_000 - MAX_PER_UID as u64);
    assert_eq!(j.iter().count(), MAX_PER_UID);
    // Another uid is not locked out by the flood.
    assert!(j
        .join("t-0", 2, 1001, &hello("y", Some("a"), 0, 1), 1.0)
        .is_some());
    // Runs that end make room: ended jobs are evicted oldest first, and kept at ENDED_KEPT.
    let ids: Vec<u64> = j.iter().filter(|x| x.uid == 1000).map(|x| x.id).collect();
    for (n, id) in ids.iter().enumerate() {
        let s = j.get(*id).unwrap().members[0].session.clone();
        j.left(*id, &s, 20_000.0 + n as f64, None);
    }
    for i in 0..1000u64 {
        let run = format!("again-{i}");
        let id = j.join(
            &format!("u-{i}"),
            1,
            1000,
            &hello("x", Some(&run), 0, 1),
            30_000.0 + i as f64,
        );
        let id = id.unwrap();
        j.left(id, &format!("u-{i}"), 30_000.5 + i as f64, None);
    }
    assert!(j.iter().count() <= ENDED_KEPT + 1, "{}", j.iter().count());
}

#[test]
fn a_long_run_whose_ranks_reconnect_keeps_its_members_bounded() {
    let mut j = Jobs::default();
    let id = j
        .join("s-0", 1, 1000, &hello("llama", Some("r"), 0, 2), 0.0)
        .unwrap();
    for i in 1..(3 * MAX_MEMBERS) {
        let s = format!("s-{i}");
        assert_eq!(
            j.join(&s, 2, 1000, &hello("llama", Some("r"), 1, 2), i as f64),
            Some(id)
        );
        j.left(id, &s, i as f64 + 0.5, None);
    }
    assert!(j.get(id).unwrap().members.len() <= MAX_MEMBERS);
    assert_eq!(j.ungrouped, 0);
}

#[test]
fn all_jobs_together_keep_at_most_max_records_sessions() {
    let mut j = Jobs::default();
    for uid in 0..20u32 {
        for r in 0..MAX_MEMBERS as u64 {
            let s = format!("s-{uid}-{r}");
            let h = hello("flood", Some("r"), r, MAX_MEMBERS as u64);
            if let Some(id) = j.join(&s, 1 + r as u32, 1000 + uid, &h, 1.0) {
                j.left(id, &s, 2.0, crash(2.0));
            }
        }
    }
    let records: usize = j.iter().map(|x| x.members.len()).sum();
    assert!(records <= MAX_RECORDS, "{records}");
    assert!(j.ungrouped == 0, "ended jobs made room: {}", j.ungrouped);
}

#[test]
fn stops_and_the_ranks_their_teardown_took_are_no_failed_ranks() {
    let mut j = Jobs::new(Rules::default());
    let h = |r| hello("llama", Some("r1"), r, 2);
    let id = j.join("s-0", 100, 1000, &h(0), 100.0).unwrap();
    j.join("s-1", 101, 1000, &h(1), 100.0).unwrap();
    let stopped = |ts| {
        Some(Failure {
            kind: Kind::Stopped,
            ts,
            step: None,
            message: "stopped".into(),
            exception: None,
            signal: Some("SIGTERM".into()),
        })
    };
    let c = j.left(id, "s-0", 101.0, stopped(101.0));
    assert!(c.consequence_of.is_none());
    // A rank its client could not tell (killed): a crash in the stop's window follows it.
    let c = j.left(id, "s-1", 101.5, crash(101.5));
    assert_eq!(
        c.consequence_of.map(|o| (o.session, o.kind)),
        Some(("s-0".into(), Kind::Stopped))
    );
    assert!(j.failed_ranks(102.0, 600.0).is_empty());
}
