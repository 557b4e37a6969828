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
    // Another user's session with the same job and run is not let in, root's neither: the uid
    // is part of the identity.
    let other = j.join("s-10", 98, 1001, &hello("llama", Some("r1"), 1, 4), 1.0);
    assert_ne!(other, a[0]);
    let root = j.join("s-11", 97, 0, &hello("llama", Some("r1"), 1, 4), 1.0);
    assert!(root.is_some());
    assert_ne!(root, a[0]);
    assert_ne!(root, other);
    assert_eq!(j.get(root.unwrap()).unwrap().uid, 0);
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
    j.left(a, "s-1", 2.0, None, Vec::new());
    j.left(a, "s-2", 2.0, None, Vec::new());
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
    let c1 = j.left(id, "s-1", 101.5, crash(101.5), Vec::new());
    assert_eq!(c1, Classified::default());
    // Rank 3's OOM happened at 100.0 but its close is read after: it is the cause, and rank 1
    // is relabelled as its consequence.
    let c3 = j.left(id, "s-3", 101.6, oom(100.0), Vec::new());
    assert_eq!(c3.consequence_of, None);
    assert_eq!(c3.relabel.len(), 1);
    assert_eq!(c3.relabel[0].0, "s-1");
    assert_eq!(
        (c3.relabel[0].1.rank, c3.relabel[0].1.kind),
        (Some(3), Kind::Oom)
    );
    let c0 = j.left(id, "s-0", 101.7, crash(101.7), Vec::new());
    assert_eq!(c0.consequence_of.map(|c| c.session), Some("s-3".into()));
    // A clean exit is no failure.
    assert_eq!(
        j.left(id, "s-2", 101.8, None, Vec::new()),
        Classified::default()
    );
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
    j.left(id, "s-0", 10.0, oom(10.0), Vec::new());
    j.left(id, "s-1", 11.0, crash(11.0), Vec::new());
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
        j.left(*id, &s, 20_000.0 + n as f64, None, Vec::new());
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
        j.left(id, &format!("u-{i}"), 30_000.5 + i as f64, None, Vec::new());
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
        j.left(id, &s, i as f64 + 0.5, None, Vec::new());
    }
    assert!(j.get(id).unwrap().members.len() <= MAX_MEMBERS);
    assert_eq!(j.ungrouped, 0);
}

#[test]
fn all_jobs_together_keep_at_most_max_records_sessions() {
    // 20 users, each a job of MAX_MEMBERS ranks whose rank 0 runs on (so the job is live and
    // does not restart) while the others crash: 5,120 sessions, five times MAX_RECORDS.
    let mut j = Jobs::default();
    let mut most = 0;
    for uid in 0..20u32 {
        let h = |r| hello("flood", Some("r"), r, MAX_MEMBERS as u64);
        let id = j.join(&format!("s-{uid}-0"), 1, 1000 + uid, &h(0), 1.0);
        assert!(id.is_some(), "user {uid}'s first rank is grouped");
        for r in 1..MAX_MEMBERS as u64 {
            let s = format!("s-{uid}-{r}");
            let id = j.join(&s, 1 + r as u32, 1000 + uid, &h(r), 1.0 + r as f64);
            let id = id.unwrap_or_else(|| panic!("{s} not grouped"));
            let records: usize = j.iter().map(|x| x.members.len()).sum();
            most = most.max(records);
            j.left(id, &s, 1.5 + r as f64, crash(1.5 + r as f64), Vec::new());
        }
    }
    assert_eq!(most, MAX_RECORDS, "the bound was reached, and held");
    let records: usize = j.iter().map(|x| x.members.len()).sum();
    assert_eq!(records, MAX_RECORDS);
    assert_eq!(j.ungrouped, 0, "ended members made room");
    // Every user's live rank is still grouped: only ended ones made room.
    let live = j
        .iter()
        .flat_map(|x| &x.members)
        .filter(|m| m.ended.is_none());
    assert_eq!(live.count(), 20);
}

#[test]
fn a_member_keeps_what_was_firing_as_it_ended_and_the_dead_job_tells_it() {
    let mut j = Jobs::default();
    let id = (0..2)
        .map(|r| {
            j.join(
                &format!("s-{r}"),
                r as u32,
                1000,
                &hello("llama", Some("r1"), r, 2),
                1.0,
            )
        })
        .last()
        .flatten()
        .unwrap();
    let leak = || {
        vec![MemberFinding {
            kind: Kind::Leak,
            message: "leak here".into(),
        }]
    };
    j.left(id, "s-1", 100.0, oom(100.0), leak());
    j.left(id, "s-0", 101.0, crash(101.0), leak());
    let job = j.get(id).unwrap();
    let members: Vec<Member> = job.members.iter().map(|r| bare(r, None)).collect();
    assert!(members.iter().all(|m| m.findings == leak()));
    let v = verdict::verdict(job.basis(|r| bare(r, None)), j.rules());
    assert_eq!(v.findings_at_failure.len(), 1);
    assert_eq!(v.findings_at_failure[0].ranks, vec![0, 1]);
    assert!(v.findings.is_empty());
}

#[test]
fn a_user_who_opened_a_job_first_does_not_get_roots_ranks_of_that_name_and_run() {
    // uid 1000 opens (llama, 42) first; root's 8 ranks then come and one runs out of memory.
    let mut j = Jobs::default();
    let bait = j
        .join("s-a", 500, 1000, &hello("llama", Some("42"), 0, 8), 1.0)
        .unwrap();
    let roots: Vec<u64> = (0..8)
        .map(|r| {
            j.join(
                &format!("s-{r}"),
                10 + r as u32,
                0,
                &hello("llama", Some("42"), r, 8),
                2.0,
            )
            .unwrap()
        })
        .collect();
    assert!(roots.iter().all(|x| *x == roots[0] && *x != bait));
    // The attacker crashes first; root's rank 5 then dies of its OOM: root's job names the OOM
    // as its cause, not a consequence of the attacker's crash.
    assert_eq!(
        j.left(bait, "s-a", 10.0, crash(10.0), Vec::new()),
        Classified::default()
    );
    let c = j.left(roots[0], "s-5", 11.0, oom(11.0), Vec::new());
    assert_eq!(c.consequence_of, None);
    assert!(c.relabel.is_empty());
}

#[test]
fn one_users_hello_then_close_flood_leaves_the_shared_records_to_others() {
    // 4 live sessions (4 jobs) and ~1,020 sessions that said hello and closed at once.
    let mut j = Jobs::default();
    let mut n = 0;
    for k in 0..4u64 {
        let run = format!("flood-{k}");
        let id = j
            .join(
                &format!("live-{k}"),
                1,
                1000,
                &hello("x", Some(&run), 0, 1024),
                0.0,
            )
            .unwrap();
        for r in 1..MAX_MEMBERS as u64 {
            let s = format!("f-{k}-{r}");
            if j.join(&s, 2, 1000, &hello("x", Some(&run), r, 1024), n as f64)
                .is_some()
            {
                j.left(id, &s, n as f64 + 0.1, crash(n as f64 + 0.1), Vec::new());
            }
            n += 1;
        }
    }
    let records: usize = j.iter().map(|x| x.members.len()).sum();
    assert_eq!(records, MAX_RECORDS, "the flood fills every record");
    // Another user's 8 ranks are all grouped, into one job.
    let ids: Vec<Option<u64>> = (0..8u64)
        .map(|r| {
            j.join(
                &format!("v-{r}"),
                100,
                2000,
                &hello("bert", Some("7"), r, 8),
                9e3,
            )
        })
        .collect();
    assert!(ids.iter().all(|x| x.is_some() && *x == ids[0]), "{ids:?}");
    assert_eq!(j.get(ids[0].unwrap()).unwrap().members.len(), 8);
    let records: usize = j.iter().map(|x| x.members.len()).sum();
    assert!(records <= MAX_RECORDS, "{records}");
    // The flooder's live sessions are all still grouped: only its ended ones made room.
    let live: usize = j
        .iter()
        .filter(|x| x.uid == 1000)
        .map(|x| x.members.iter().filter(|m| m.ended.is_none()).count())
        .sum();
    assert_eq!(live, 4);
}

#[test]
fn another_users_churn_of_ended_jobs_does_not_push_out_a_failed_job() {
    let mut j = Jobs::default();
    let victim = j
        .join("v", 1, 2000, &hello("bert", Some("7"), 0, 1), 0.0)
        .unwrap();
    j.left(victim, "v", 1.0, oom(1.0), Vec::new());
    for i in 0..1000u64 {
        let run = format!("churn-{i}");
        let id = j
            .join(
                &format!("c-{i}"),
                2,
                1000,
                &hello("x", Some(&run), 0, 1),
                2.0 + i as f64,
            )
            .unwrap();
        j.left(id, &format!("c-{i}"), 2.5 + i as f64, None, Vec::new());
    }
    assert!(j.get(victim).is_some(), "the victim's failed job is kept");
    assert!(j.iter().filter(|x| !x.live()).count() <= ENDED_KEPT);
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
    let c = j.left(id, "s-0", 101.0, stopped(101.0), Vec::new());
    assert!(c.consequence_of.is_none());
    // A rank its client could not tell (killed): a crash in the stop's window follows it.
    let c = j.left(id, "s-1", 101.5, crash(101.5), Vec::new());
    assert_eq!(
        c.consequence_of.map(|o| (o.session, o.kind)),
        Some(("s-0".into(), Kind::Stopped))
    );
    assert!(j.failed_ranks(102.0, 600.0).is_empty());
}
