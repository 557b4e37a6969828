use super::*;
use crate::core::jobs::view::{Failure, MemberFinding, Stray};

const GIB: u64 = 1 << 30;

fn member(rank: u64, host: &str) -> Member {
    Member {
        session: format!("s-{rank}"),
        rank: Some(rank),
        host: Some(host.into()),
        file: None,
        pid: 100 + rank as u32,
        gpu_uuid: Some(format!("GPU-{rank}")),
        started: 0.0,
        ended: None,
        failure: None,
        peak_bytes: Some((20 + rank) * GIB),
        headroom_bytes: Some(((60 - rank) * GIB) as i64),
        oom_eta_seconds: None,
        findings: Vec::new(),
        stray: Vec::new(),
    }
}

fn fail(m: &mut Member, kind: Kind, ts: f64) {
    m.ended = Some(ts + 0.1);
    m.failure = Some(Failure {
        kind,
        ts,
        step: Some(812),
        message: format!("{kind} here"),
        exception: None,
        signal: None,
    });
}

fn job(members: Vec<Member>) -> Basis {
    Basis {
        job: "llama".into(),
        run_id: Some("r1".into()),
        world_size: Some(8),
        members,
        ..Basis::default()
    }
}

#[test]
fn the_first_failure_is_the_cause_and_the_rest_follow_it() {
    let mut ms: Vec<Member> = (0..8).map(|r| member(r, "a")).collect();
    for (r, m) in ms.iter_mut().enumerate() {
        if r == 5 {
            fail(m, Kind::Oom, 100.0);
        } else {
            fail(m, Kind::Crash, 101.5);
        }
    }
    let v = verdict(job(ms), &Rules::default());
    assert_eq!(v.state, JobState::Failed);
    let f = v.first_failure.as_ref().unwrap();
    assert_eq!((f.rank, f.kind, f.step), (Some(5), Kind::Oom, Some(812)));
    assert!(f.order_unknown.is_empty());
    assert_eq!(v.consequences.len(), 7);
    assert!(v
        .consequences
        .iter()
        .all(|c| (c.after_seconds - 1.5).abs() < 1e-9));
    assert!(v.other_failures.is_empty());
    assert_eq!(
        summary(&v),
        "failed: rank 5 oom on a at step 812, then 7 ranks within 1.5 s"
    );
}

#[test]
fn a_failure_past_the_cascade_window_is_not_a_consequence() {
    let mut ms: Vec<Member> = (0..2).map(|r| member(r, "a")).collect();
    fail(&mut ms[0], Kind::Crash, 100.0);
    fail(&mut ms[1], Kind::Crash, 100.0 + 61.0);
    let v = verdict(job(ms), &Rules::default());
    assert_eq!(v.first_failure.unwrap().rank, Some(0));
    assert!(v.consequences.is_empty());
    assert_eq!(v.other_failures.len(), 1);
}

#[test]
fn an_oom_at_the_same_instant_as_a_crash_comes_first() {
    let mut ms: Vec<Member> = (0..2).map(|r| member(r, "a")).collect();
    fail(&mut ms[0], Kind::Crash, 100.0);
    fail(&mut ms[1], Kind::Oom, 100.0);
    let v = verdict(job(ms), &Rules::default());
    assert_eq!(v.first_failure.unwrap().rank, Some(1));
}

#[test]
fn hosts_closer_than_the_clock_tolerance_leave_the_order_unknown() {
    let mut ms = vec![member(0, "a"), member(1, "b"), member(2, "b")];
    fail(&mut ms[0], Kind::Oom, 100.0);
    fail(&mut ms[1], Kind::Crash, 100.3);
    // Same host as rank 1 but far enough from rank 0: ordered.
    fail(&mut ms[2], Kind::Crash, 101.5);
    let v = verdict(job(ms.clone()), &Rules::default());
    let f = v.first_failure.unwrap();
    assert_eq!(f.rank, Some(0));
    assert_eq!(f.order_unknown, vec![1]);
    assert!(summary(&verdict(job(ms.clone()), &Rules::default())).contains("order unknown"));
    // On one host the same times are ordered: one clock.
    for m in &mut ms {
        m.host = Some("a".into());
    }
    assert!(verdict(job(ms.clone()), &Rules::default())
        .first_failure
        .unwrap()
        .order_unknown
        .is_empty());
    // A host whose clock is known to be off: nothing on it is ordered against another host.
    ms[1].host = Some("b".into());
    ms[1].failure.as_mut().unwrap().ts = 105.0;
    let mut b = job(ms);
    b.skewed_hosts = vec!["b".into()];
    assert_eq!(
        verdict(b, &Rules::default())
            .first_failure
            .unwrap()
            .order_unknown,
        vec![1]
    );
}

#[test]
fn one_kind_on_many_ranks_is_one_finding_naming_them() {
    let mut ms: Vec<Member> = (0..8).map(|r| member(r, "a")).collect();
    for m in &mut ms {
        m.findings.push(MemberFinding {
            kind: Kind::Leak,
            message: "allocated floor grows 8.0 MiB/step".into(),
        });
    }
    ms[3].findings.push(MemberFinding {
        kind: Kind::NearLimit,
        message: "near".into(),
    });
    ms[3].findings.push(MemberFinding {
        kind: Kind::Crash,
        message: "crash".into(),
    });
    let v = verdict(job(ms), &Rules::default());
    assert_eq!(v.findings.len(), 2, "{:?}", v.findings);
    assert_eq!(v.findings[0].kind, Kind::Leak);
    assert_eq!(v.findings[0].ranks, (0..8).collect::<Vec<_>>());
    assert_eq!(
        v.findings[0].message,
        "leak on 8 of 8 ranks (0-7): allocated floor grows 8.0 MiB/step"
    );
    assert_eq!(
        v.findings[1].message,
        "near_limit on 1 of 8 ranks (3): near"
    );
}

#[test]
fn memory_is_the_spread_of_the_ranks_and_the_soonest_forecast() {
    let mut ms: Vec<Member> = (0..4).map(|r| member(r, "a")).collect();
    ms[0].peak_bytes = Some(30 * GIB); // rank 0 keeps extra state
    ms[2].oom_eta_seconds = Some(900.0);
    ms[1].oom_eta_seconds = Some(4000.0);
    ms[3].stray.push(Stray {
        gpu_uuid: "GPU-0".into(),
        gpu: Some(0),
        bytes: 500 << 20,
    });
    let v = verdict(job(ms), &Rules::default());
    let m = &v.memory;
    assert_eq!(m.peak_max_bytes, Some(30 * GIB));
    assert_eq!(m.peak_max_rank, Some(0));
    assert_eq!(m.peak_min_bytes, Some(21 * GIB));
    assert_eq!(m.spread_bytes, Some(9 * GIB));
    assert_eq!(m.peak_median_bytes, Some(23 * GIB));
    assert_eq!(
        (m.headroom_bytes, m.headroom_rank),
        (Some((57 * GIB) as i64), Some(3))
    );
    assert_eq!((v.oom_eta_seconds, m.oom_eta_rank), (Some(900.0), Some(2)));
    assert_eq!(m.stray.len(), 1);
    assert_eq!(m.stray[0].rank, Some(3));
    assert_eq!(v.state, JobState::Running);
}

#[test]
fn an_ended_job_without_failure_is_ended() {
    let mut ms = vec![member(0, "a")];
    ms[0].ended = Some(5.0);
    assert_eq!(verdict(job(ms), &Rules::default()).state, JobState::Ended);
}

#[test]
fn ranks_read_as_a_person_writes_them() {
    assert_eq!(ranks_text(&[0, 1, 2, 3, 5, 7, 8]), "0-3,5,7,8");
    assert_eq!(ranks_text(&[4]), "4");
    assert_eq!(ranks_text(&[]), "");
}

fn leaking(m: &mut Member) {
    m.findings = vec![MemberFinding {
        kind: Kind::Leak,
        message: "memory that survives each step grows 64.0 MiB/step".into(),
    }];
}

#[test]
fn a_dead_job_keeps_what_was_firing_at_its_first_failure() {
    // All 8 ranks leak alike; rank 5 runs out of memory and the rest are taken down. Each ended
    // member carries what was firing as it ended, as the registry keeps it.
    let mut ms: Vec<Member> = (0..8).map(|r| member(r, "a")).collect();
    for (r, m) in ms.iter_mut().enumerate() {
        leaking(m);
        fail(
            m,
            if r == 5 { Kind::Oom } else { Kind::Crash },
            100.0 + (r != 5) as u8 as f64,
        );
    }
    let v = verdict(job(ms), &Rules::default());
    // Nothing fires now: every rank is gone.
    assert!(v.findings.is_empty(), "{:?}", v.findings);
    assert_eq!(v.findings_at_failure.len(), 1);
    let f = &v.findings_at_failure[0];
    assert_eq!((f.kind, f.ranks.clone()), (Kind::Leak, (0..8).collect()));
    assert!(
        f.message.starts_with("leak on 8 of 8 ranks (0-7)"),
        "{}",
        f.message
    );
    assert_eq!(
        summary(&v),
        "failed: leak on 8 of 8 ranks, then rank 5 oom on a at step 812, then 7 ranks within 1.0 s"
    );
}

fn stop(m: &mut Member, signal: &str, ts: f64) {
    fail(m, Kind::Stopped, ts);
    if let Some(f) = m.failure.as_mut() {
        f.signal = Some(signal.into());
    }
}

#[test]
fn a_job_whose_ranks_were_all_stopped_is_stopped_not_failed() {
    let mut ms: Vec<Member> = (0..4).map(|r| member(r, "a")).collect();
    for (r, m) in ms.iter_mut().enumerate() {
        stop(m, "SIGTERM", 100.0 + r as f64 * 0.1);
    }
    let v = verdict(job(ms), &Rules::default());
    assert_eq!(v.state, JobState::Stopped);
    assert!(v.first_failure.is_none());
    let s = v.stop.as_ref().unwrap();
    assert_eq!((s.rank, s.kind), (Some(0), Kind::Stopped));
    assert_eq!(s.signal.as_deref(), Some("SIGTERM"));
    assert_eq!(v.consequences.len(), 3);
    assert!(v.other_failures.is_empty());
    assert_eq!(
        summary(&v),
        "stopped: rank 0 by SIGTERM on a at step 812, then 3 ranks within 0.3 s"
    );
}

#[test]
fn a_rank_that_raised_first_is_the_cause_and_the_teardown_stops_follow_it() {
    // torchrun: rank 2 raises, then SIGTERM takes the other ranks down.
    let mut ms: Vec<Member> = (0..4).map(|r| member(r, "a")).collect();
    for (r, m) in ms.iter_mut().enumerate() {
        if r == 2 {
            fail(m, Kind::Crash, 100.0);
            if let Some(f) = m.failure.as_mut() {
                f.exception = Some("RuntimeError: rank 2 is broken".into());
            }
        } else {
            stop(m, "SIGTERM", 101.0);
        }
    }
    let v = verdict(job(ms), &Rules::default());
    assert_eq!(v.state, JobState::Failed);
    assert!(v.stop.is_none());
    let f = v.first_failure.as_ref().unwrap();
    assert_eq!((f.rank, f.kind), (Some(2), Kind::Crash));
    assert_eq!(
        f.exception.as_deref(),
        Some("RuntimeError: rank 2 is broken")
    );
    let followed: Vec<_> = v.consequences.iter().map(|c| (c.rank, c.kind)).collect();
    assert_eq!(
        followed,
        [0, 1, 3].map(|r| (Some(r), Kind::Stopped)).to_vec()
    );
    assert_eq!(
        summary(&v),
        "failed: rank 2 crash (RuntimeError: rank 2 is broken) on a at step 812, then 3 ranks within 1.0 s"
    );
}

#[test]
fn a_live_rank_tells_what_fires_now_and_an_earlier_end_tells_nothing() {
    let mut ms: Vec<Member> = (0..4).map(|r| member(r, "a")).collect();
    // Rank 0 ended cleanly long before the failure, with a leak firing then: not the story.
    leaking(&mut ms[0]);
    ms[0].ended = Some(10.0);
    // Rank 1 fails; rank 2 is live and leaking now.
    fail(&mut ms[1], Kind::Oom, 100.0);
    leaking(&mut ms[2]);
    let v = verdict(job(ms), &Rules::default());
    assert_eq!(v.findings.len(), 1, "live rank 2's leak fires now");
    assert_eq!(v.findings[0].ranks, vec![2]);
    assert_eq!(v.findings_at_failure.len(), 1);
    assert_eq!(v.findings_at_failure[0].ranks, vec![2]);
    // A job that did not fail has no such story.
    let mut ms: Vec<Member> = (0..2).map(|r| member(r, "a")).collect();
    leaking(&mut ms[0]);
    let v = verdict(job(ms), &Rules::default());
    assert!(v.findings_at_failure.is_empty());
    assert_eq!(summary(&v), "running");
}

#[test]
fn a_crash_in_a_stops_teardown_follows_it_and_a_failure_past_the_window_does_not() {
    let mut ms: Vec<Member> = (0..3).map(|r| member(r, "a")).collect();
    stop(&mut ms[0], "SIGINT", 100.0);
    fail(&mut ms[1], Kind::Crash, 102.0);
    let v = verdict(job(ms.clone()), &Rules::default());
    assert_eq!(v.state, JobState::Stopped);
    assert_eq!(v.consequences[0].rank, Some(1));
    // A failure long after the stop is a failure of its own: the job failed.
    fail(&mut ms[2], Kind::Oom, 100.0 + DEFAULT_CASCADE_SECONDS + 5.0);
    let mut late = ms.clone();
    late.remove(1);
    let v = verdict(job(late), &Rules::default());
    assert_eq!(v.state, JobState::Failed);
    assert_eq!(v.first_failure.as_ref().map(|f| f.rank), Some(Some(2)));
    assert!(v.other_failures.is_empty() && v.consequences.is_empty());
    // A failure just before the stop is the cause, the stop its consequence.
    let mut ms: Vec<Member> = (0..2).map(|r| member(r, "a")).collect();
    fail(&mut ms[1], Kind::Oom, 99.5);
    stop(&mut ms[0], "SIGTERM", 100.0);
    let v = verdict(job(ms), &Rules::default());
    assert_eq!(v.state, JobState::Failed);
    assert_eq!(v.first_failure.as_ref().map(|f| f.kind), Some(Kind::Oom));
    assert_eq!(v.consequences[0].kind, Kind::Stopped);
}
