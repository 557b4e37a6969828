use super::*;

fn hello() -> Hello {
    Hello {
        v: 1,
        ns_pid: Some(1),
        job: Some("j".into()),
        rank: Some(0),
        cuda_device: Some(0),
        gpu_uuid: Some("GPU-1".into()),
        ..Hello::default()
    }
}

fn sample(ts: f64, retries: u64) -> Sample {
    Sample {
        ts,
        step: Some(ts as u64),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(100),
            alloc_retries: Some(retries),
            ..Stats::default()
        },
        device_free: None,
        device_total: None,
        alloc_limit: None,
        categories: None,
    }
}

const PEER: Peer = Peer {
    pid: 10,
    uid: 0,
    gid: 0,
};

#[test]
fn ids_carry_the_daemon_start_so_a_restart_does_not_reuse_them() {
    let mut before = Sessions::new(SessionLimits::default()).with_id_epoch(1_763_700_000.0);
    let mut jobs = Jobs::default();
    // A restart 1 ms later.
    let mut after = Sessions::new(SessionLimits::default()).with_id_epoch(1_763_700_000.001);
    let (_, a) = before.open(&mut jobs, PEER, hello(), 0.0);
    let (_, b) = after.open(&mut jobs, PEER, hello(), 0.0);
    assert_eq!(a, "s-mi8dfxmo-1");
    assert_eq!(b, "s-mi8dfxmp-1");
    assert!(before.get(&a).is_some(), "found by its id");
    assert!(before.get(&b).is_none() && before.get("s-1").is_none());
    assert_eq!(base36(0), "0");
    assert_eq!(base36(35), "z");
}

#[test]
fn counters_survive_resets() {
    let mut c = Counter::default();
    for raw in [3, 5, 5, 1, 4] {
        c.observe(Some(raw));
    }
    // 3, +2, +0, reset to 1 (+1), +3
    assert_eq!(c.total, 9);
}

#[test]
fn sessions_are_bounded_in_points_events_and_ended_count() {
    let limits = SessionLimits {
        points: 5,
        events: 3,
        ended_kept: 2,
    };
    let mut s = Sessions::new(limits);
    let mut jobs = Jobs::default();
    for round in 0..10 {
        let (key, id) = s.open(&mut jobs, PEER, hello(), 0.0);
        assert_eq!(id, format!("s-{}", round + 1));
        for i in 0..100 {
            s.sample(key, sample(i as f64, 0), 0.0);
            s.event(
                key,
                Event {
                    ts: i as f64,
                    kind: "mark".into(),
                    alloc_bytes: None,
                    device_free: None,
                    alloc_limit: None,
                    phase: None,
                    detail: Some("x".into()),
                    path: None,
                    dropped: None,
                    explanation: None,
                    ending: None,
                },
            );
        }
        let sess = s.live().next().unwrap();
        assert_eq!(sess.series.len(), 5);
        assert_eq!(sess.events.len(), 3);
        s.close(&mut jobs, key, Ending::Crash, 1.0);
    }
    assert_eq!(s.live_count(), 0);
    assert_eq!(s.ended().count(), 2);
    let last = s.ended().last().unwrap();
    assert_eq!(last.ended, Some((1.0, Ending::Crash)));
    assert_eq!(last.events.back().unwrap().kind, "crash");
}

#[test]
fn sessions_are_found_by_id_live_or_ended() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (a, _) = s.open(&mut jobs, PEER, hello(), 0.0);
    s.open(&mut jobs, PEER, hello(), 0.0);
    s.close(&mut jobs, a, Ending::Clean, 1.0);
    assert!(s.get("s-1").unwrap().ended.is_some());
    assert!(s.get("s-2").unwrap().ended.is_none());
    for missing in ["s-3", "s-02", "2", "s-", "s-x"] {
        assert!(s.get(missing).is_none(), "{missing}");
    }
}

#[test]
fn a_clean_bye_records_no_crash() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (key, _) = s.open(&mut jobs, PEER, hello(), 0.0);
    s.sample(key, sample(1.0, 2), 1.0);
    s.close(&mut jobs, key, Ending::Clean, 2.0);
    let sess = s.ended().next().unwrap();
    assert!(sess.events.is_empty());
    assert_eq!(sess.retries.total, 2);
}

#[test]
fn the_session_keeps_the_latest_alloc_limit() {
    const GIB: u64 = 1 << 30;
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (key, _) = s.open(
        &mut jobs,
        PEER,
        Hello {
            alloc_limit: Some(4 * GIB),
            ..hello()
        },
        0.0,
    );
    let limit = |s: &Sessions| s.live().next().unwrap().alloc_limit;
    assert_eq!(limit(&s), Some(4 * GIB));
    // A sample without the field keeps it; one with it changes it.
    s.sample(key, sample(1.0, 0), 1.0);
    assert_eq!(limit(&s), Some(4 * GIB));
    s.sample(
        key,
        Sample {
            alloc_limit: Some(6 * GIB),
            ..sample(2.0, 0)
        },
        2.0,
    );
    assert_eq!(limit(&s), Some(6 * GIB));
    let oom = |alloc_limit| Event {
        ts: 3.0,
        kind: "oom".into(),
        alloc_bytes: Some(GIB),
        device_free: Some(70 * GIB),
        alloc_limit,
        phase: None,
        detail: None,
        path: None,
        dropped: None,
        explanation: None,
        ending: None,
    };
    // An oom event without it is recorded with the session's; one with it updates it.
    s.event(key, oom(None));
    assert_eq!(
        s.live().next().unwrap().events.get(0).unwrap().alloc_limit,
        Some(6 * GIB)
    );
    s.event(key, oom(Some(5 * GIB)));
    assert_eq!(limit(&s), Some(5 * GIB));
    assert_eq!(
        s.live().next().unwrap().events.get(1).unwrap().alloc_limit,
        Some(5 * GIB)
    );
}

fn oom(ts: f64) -> Event {
    Event {
        ts,
        kind: "oom".into(),
        alloc_bytes: Some(1 << 30),
        device_free: Some(1 << 20),
        alloc_limit: None,
        phase: None,
        detail: None,
        path: None,
        dropped: None,
        explanation: None,
        ending: None,
    }
}

fn with_ooms(ts: f64, ooms: u64) -> Sample {
    let mut s = sample(ts, 0);
    s.stats.ooms = Some(ooms);
    s
}

#[test]
fn an_oom_event_counts_even_when_no_sample_follows() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (key, _) = s.open(&mut jobs, PEER, hello(), 0.0);
    s.sample(key, with_ooms(1.0, 0), 1.0);
    s.event(key, oom(2.0));
    assert_eq!(s.live().next().unwrap().ooms.total, 1);
    s.close(&mut jobs, key, Ending::Crash, 3.0);
    assert_eq!(s.ended().next().unwrap().ooms.total, 1);
}

#[test]
fn an_oom_seen_as_event_and_counter_counts_once() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (key, _) = s.open(&mut jobs, PEER, hello(), 0.0);
    let total = |s: &Sessions| s.live().next().unwrap().ooms.total;
    s.event(key, oom(1.0));
    s.sample(key, with_ooms(2.0, 1), 2.0);
    assert_eq!(total(&s), 1);
    // A second OOM: the counter first, then its event.
    s.sample(key, with_ooms(3.0, 2), 3.0);
    s.event(key, oom(3.5));
    assert_eq!(total(&s), 2);
    // OOMs caught without an event (the observer not installed) still count.
    s.sample(key, with_ooms(4.0, 5), 4.0);
    assert_eq!(total(&s), 5);
}

#[test]
fn the_node_counts_survived_only_among_the_oom_events_it_counted() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let node = |s: &Sessions| {
        let total: u64 = s.oom_counts.by_pattern().map(|(_, n)| n).sum();
        (total, s.oom_counts.survived)
    };
    // Trainer A: an OOM seen only as a counter rise (no observer), and it went on.
    let (a, ida) = s.open(&mut jobs, PEER, hello(), 0.0);
    s.sample(a, with_ooms(1.0, 0), 1.0);
    s.sample(a, with_ooms(2.0, 1), 2.0);
    s.sample(a, with_ooms(3.0, 1), 3.0);
    assert_eq!(node(&s), (0, 0), "a counter-only OOM is not a node event");
    let la = s.live().find(|x| x.id == ida).unwrap();
    assert_eq!(
        (la.ooms.total, la.ooms_survived),
        (1, 1),
        "per trainer it is"
    );
    // Trainer B: a fatal OOM event, no sample after it. The node shows it unsurvived.
    let (b, _) = s.open(
        &mut jobs,
        PEER,
        Hello {
            rank: Some(1),
            ..hello()
        },
        3.0,
    );
    s.sample(b, with_ooms(3.0, 0), 3.0);
    s.event(b, oom(4.0));
    assert_eq!(node(&s), (1, 0));
    // Event then its counter in the next sample: one survived, once.
    s.event(a, oom(5.0));
    s.sample(a, with_ooms(6.0, 2), 6.0);
    s.sample(a, with_ooms(7.0, 2), 7.0);
    assert_eq!(node(&s), (2, 1));
}

#[test]
fn a_restart_read_before_the_old_close_resolves_the_crash_at_once() {
    use crate::core::detect::Kind;
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (old, _) = s.open(&mut jobs, PEER, hello(), 0.0);
    // The new connection's hello is handled first, then the old one's EOF.
    let (_, id) = s.open(&mut jobs, PEER, hello(), 5.0);
    s.close(&mut jobs, old, Ending::Crash, 5.1);
    assert_eq!(s.firing().filter(|f| f.kind == Kind::Crash).count(), 0);
    let resolved = s.findings.recent().last().unwrap();
    assert!(resolved.message.ends_with(&format!("restarted as {id}")));
    // A session that was already running beside it (started earlier) is not a restart.
    let rank3 = || Hello {
        rank: Some(3),
        ..hello()
    };
    s.open(&mut jobs, PEER, rank3(), 6.0);
    let (later, _) = s.open(&mut jobs, PEER, rank3(), 7.0);
    s.close(&mut jobs, later, Ending::Crash, 8.0);
    assert_eq!(s.firing().filter(|f| f.kind == Kind::Crash).count(), 1);
}

#[test]
fn a_trainer_restarting_resolves_its_crash() {
    use crate::core::detect::{FindingState, Kind};
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (a, _) = s.open(&mut jobs, PEER, hello(), 0.0);
    let (other, _) = s.open(
        &mut jobs,
        PEER,
        Hello {
            rank: Some(1),
            ..hello()
        },
        0.0,
    );
    s.close(&mut jobs, a, Ending::Crash, 5.0);
    s.close(&mut jobs, other, Ending::Crash, 5.0);
    assert_eq!(s.firing().filter(|f| f.kind == Kind::Crash).count(), 2);
    // Another user with the same job and rank is not this trainer.
    s.open(&mut jobs, Peer { uid: 7, ..PEER }, hello(), 6.0);
    assert_eq!(s.firing().filter(|f| f.kind == Kind::Crash).count(), 2);
    let (_, id) = s.open(&mut jobs, PEER, hello(), 7.0);
    let firing: Vec<_> = s.firing().map(|f| f.id.clone()).collect();
    assert_eq!(firing, ["s-2/crash"], "rank 1 did not restart");
    let resolved = s.findings.recent().last().unwrap();
    assert_eq!(resolved.id, "s-1/crash");
    assert_eq!(resolved.state, FindingState::Resolved);
    assert_eq!(resolved.resolved_ts, Some(7.0));
    assert!(
        resolved.message.ends_with(&format!("restarted as {id}")),
        "{}",
        resolved.message
    );
    assert_eq!(
        resolved.evidence.detail.as_deref(),
        Some(format!("restarted as {id}").as_str())
    );
    let crashes = s
        .findings
        .totals()
        .find(|(k, _)| *k == Kind::Crash)
        .unwrap()
        .1;
    assert_eq!(crashes, 2, "it still counts as a crash");
    // A clean end leaves nothing to resolve, and nothing resolves twice.
    let before = s.findings.recent().count();
    s.open(&mut jobs, PEER, hello(), 8.0);
    assert_eq!(s.findings.recent().count(), before);
}
