//! A job of 8 ranks on one node dies as torchrun takes it down: rank 5 runs out of memory, the
//! other 7 are killed 1.5 s later. One failure pages (rank 5's oom, kept firing after its
//! session ended); the 7 crashes are warnings that name it; the API's job says so.

use super::*;
use crate::core::detect::findings::Severity;
use crate::core::detect::{Finding, FindingState, Kind};
use crate::core::jobs::JobState;
use crate::core::snapshot::Snapshot;
use crate::core::store::{HistoryLimits, Store};

const GIB: u64 = 1 << 30;

fn hello(rank: u64) -> Hello {
    Hello {
        v: 1,
        job: Some("llama".into()),
        run_id: Some("r1".into()),
        rank: Some(rank),
        world_size: Some(8),
        gpu_uuid: Some(format!("GPU-{rank}")),
        ..Hello::default()
    }
}

fn sample(step: u64, ts: f64, rank: u64) -> Sample {
    Sample {
        ts,
        step: Some(step),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(20 * GIB),
            allocated_peak: Some((30 + rank) * GIB),
            reserved: Some(40 * GIB),
            ..Stats::default()
        },
        device_free: Some(40 * GIB),
        device_total: Some(80 * GIB),
        alloc_limit: None,
        categories: None,
    }
}

fn oom(ts: f64) -> Event {
    Event {
        ts,
        kind: EventKind::Oom,
        alloc_bytes: Some(2 * GIB),
        device_free: Some(100 << 20),
        alloc_limit: None,
        phase: None,
        detail: Some("CUDA out of memory. Tried to allocate 2.00 GiB".into()),
        path: None,
        dropped: None,
        explanation: None,
        ending: None,
    }
}

fn peer(rank: u64) -> Peer {
    Peer {
        pid: 1000 + rank as u32,
        uid: 1000,
        gid: 1000,
    }
}

fn job_of_8(s: &mut Sessions, jobs: &mut Jobs) -> Vec<u64> {
    let keys: Vec<u64> = (0..8)
        .map(|r| s.open(jobs, peer(r), hello(r), 10.0).0)
        .collect();
    for step in 1..=20 {
        for (r, k) in keys.iter().enumerate() {
            s.sample(
                *k,
                sample(step, 10.0 + step as f64, r as u64),
                10.0 + step as f64,
            );
        }
    }
    keys
}

fn firing(s: &Sessions) -> Vec<Finding> {
    s.firing().cloned().collect()
}

#[test]
fn the_first_failure_pages_and_the_ranks_it_took_down_do_not() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let keys = job_of_8(&mut s, &mut jobs);
    s.event(keys[5], oom(100.0));
    s.close(&mut jobs, keys[5], Ending::Crash, 100.2);
    for (r, k) in keys.iter().enumerate().filter(|(r, _)| *r != 5) {
        s.close(&mut jobs, *k, Ending::Crash, 101.5 + r as f64 * 0.01);
    }
    let f = firing(&s);
    let critical: Vec<&Finding> = f
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect();
    assert_eq!(critical.len(), 1, "{critical:#?}");
    assert_eq!(
        (critical[0].kind, critical[0].subject.rank),
        (Kind::Oom, Some(5))
    );
    assert_eq!(critical[0].subject.run_id.as_deref(), Some("r1"));
    let crashes: Vec<&Finding> = f.iter().filter(|f| f.kind == Kind::Crash).collect();
    assert_eq!(crashes.len(), 8);
    for c in &crashes {
        assert_eq!(c.severity, Severity::Warning);
        let of = c.consequence_of.as_ref().unwrap();
        assert_eq!((of.rank, of.kind), (Some(5), Kind::Oom), "{}", c.message);
    }
    let r0 = crashes.iter().find(|c| c.subject.rank == Some(0)).unwrap();
    assert!(
        r0.message.ends_with("; after rank 5's oom (s-6)"),
        "{}",
        r0.message
    );

    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    store.sessions = s;
    store.jobs = jobs;
    let snap = Snapshot::build(&store, "node-a", 0.0);
    assert_eq!(snap.jobs.len(), 1);
    let j = &snap.jobs[0];
    assert_eq!((j.job.as_str(), j.run_id.as_deref()), ("llama", Some("r1")));
    assert_eq!(j.state, JobState::Failed);
    assert_eq!(j.ranks, (0..8).collect::<Vec<_>>());
    let first = j.first_failure.as_ref().unwrap();
    assert_eq!(
        (first.rank, first.kind, first.ts),
        (Some(5), Kind::Oom, 100.0)
    );
    assert_eq!(first.step, Some(20));
    assert_eq!(first.host.as_deref(), Some("node-a"));
    assert_eq!(j.consequences.len(), 7);
    // Spread of the ranks' step peaks: 30..37 GiB, rank 7 at the top.
    assert_eq!(j.memory.peak_max_rank, Some(7));
    assert_eq!(j.memory.spread_bytes, Some(7 * GIB));
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(json["jobs"][0]["first_failure"]["rank"], 5);
    assert_eq!(json["jobs"][0]["state"], "failed");
    let c = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "crash" && f["rank"] == 0)
        .unwrap();
    assert_eq!(c["consequence_of"]["rank"], 5);
    assert_eq!(c["consequence_of"]["kind"], "oom");
    // The hold over, everything resolves.
    store.sessions.tick(101.6 + 600.0);
    assert!(store.sessions.firing().next().is_none());
}

#[test]
fn the_same_leak_on_every_rank_is_one_job_finding() {
    let mut s = Sessions::new(SessionLimits::default()).with_detect(DetectConfig::default());
    let mut jobs = Jobs::default();
    let keys: Vec<u64> = (0..8)
        .map(|r| s.open(&mut jobs, peer(r), hello(r), 0.0).0)
        .collect();
    for step in 1..=400u64 {
        for k in &keys {
            let mut x = sample(step, step as f64, 0);
            x.stats.allocated = Some(20 * GIB + step * (8 << 20));
            x.stats.allocated_peak = Some(30 * GIB + step * (8 << 20));
            s.sample(*k, x, step as f64);
        }
    }
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    store.sessions = s;
    store.jobs = jobs;
    let snap = Snapshot::build(&store, "h", 0.0);
    let j = &snap.jobs[0];
    let leak: Vec<_> = j.findings.iter().filter(|f| f.kind == Kind::Leak).collect();
    assert_eq!(leak.len(), 1, "{:?}", j.findings);
    assert_eq!(leak[0].ranks, (0..8).collect::<Vec<_>>());
    assert!(
        leak[0].message.starts_with("leak on 8 of 8 ranks (0-7): "),
        "{}",
        leak[0].message
    );
    assert_eq!(j.state, JobState::Running);
    assert!(j.oom_eta_seconds.is_some() && j.memory.oom_eta_rank.is_some());
    assert_eq!(
        snap.findings
            .iter()
            .filter(|f| f.kind == Kind::Leak && f.state == FindingState::Firing)
            .count(),
        8,
        "every per-session view stays"
    );
}

#[test]
fn another_users_session_cannot_join_the_job() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let keys = job_of_8(&mut s, &mut jobs);
    let mallory = Peer {
        pid: 666,
        uid: 1001,
        gid: 1001,
    };
    // Mallory claims rank 0 of the same run and crashes first: it is not the job's failure.
    let (m, _) = s.open(&mut jobs, mallory, hello(0), 50.0);
    s.close(&mut jobs, m, Ending::Crash, 60.0);
    s.event(keys[5], oom(100.0));
    s.close(&mut jobs, keys[5], Ending::Crash, 100.2);
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    store.sessions = s;
    store.jobs = jobs;
    let snap = Snapshot::build(&store, "h", 0.0);
    let ours = snap.jobs.iter().find(|j| j.sessions.len() == 8).unwrap();
    assert_eq!(ours.first_failure.as_ref().unwrap().rank, Some(5));
    assert_eq!(snap.jobs.len(), 2, "mallory's session is a job of its own");
    let uids: Vec<Option<u32>> = snap.jobs.iter().map(|j| j.uid).collect();
    assert!(
        uids.contains(&Some(1000)) && uids.contains(&Some(1001)),
        "{uids:?}"
    );
    let theirs = snap.jobs.iter().find(|j| j.uid == Some(1001)).unwrap();
    assert_ne!(theirs.name(), ours.name());
}

#[test]
fn root_is_no_exception_a_job_another_user_opened_first_gets_none_of_roots_ranks() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let mallory = Peer {
        pid: 666,
        uid: 1001,
        gid: 1001,
    };
    let (m, _) = s.open(&mut jobs, mallory, hello(0), 5.0);
    let root = |r: u64| Peer {
        pid: 2000 + r as u32,
        uid: 0,
        gid: 0,
    };
    let keys: Vec<u64> = (0..8)
        .map(|r| s.open(&mut jobs, root(r), hello(r), 10.0).0)
        .collect();
    for (r, k) in keys.iter().enumerate() {
        s.sample(*k, sample(1, 11.0, r as u64), 11.0);
    }
    s.close(&mut jobs, m, Ending::Crash, 60.0);
    s.event(keys[5], oom(100.0));
    s.close(&mut jobs, keys[5], Ending::Crash, 100.2);
    let five = s
        .firing()
        .find(|f| f.kind == Kind::Oom && f.subject.rank == Some(5))
        .cloned()
        .unwrap();
    assert_eq!(five.severity, Severity::Critical, "root's OOM still pages");
    assert!(five.consequence_of.is_none(), "{five:#?}");
    assert_eq!(five.subject.uid, Some(0));
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    store.sessions = s;
    store.jobs = jobs;
    let snap = Snapshot::build(&store, "h", 0.0);
    let roots = snap.jobs.iter().find(|j| j.uid == Some(0)).unwrap();
    assert_eq!(roots.ranks, (0..8).collect::<Vec<u64>>());
    let f = roots.first_failure.as_ref().unwrap();
    assert_eq!((f.rank, f.kind), (Some(5), Kind::Oom));
}

#[test]
fn a_rank_cannot_backdate_an_oom_before_its_own_lines_to_take_over_as_the_cause() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let keys = job_of_8(&mut s, &mut jobs);
    s.event(keys[5], oom(100.0));
    s.close(&mut jobs, keys[5], Ending::Crash, 100.2);
    // Rank 3 keeps sending (a sample dated 101), then an OOM dated a second before rank 5's:
    // it is taken at its own previous line's time, 101, and follows rank 5's.
    s.sample(keys[3], sample(21, 101.0, 3), 101.0);
    let clamped = s.timestamps_clamped;
    s.event(keys[3], oom(99.0));
    assert_eq!(s.timestamps_clamped, clamped + 1);
    s.close(&mut jobs, keys[3], Ending::Crash, 101.3);
    let five = s
        .firing()
        .find(|f| f.kind == Kind::Oom && f.subject.rank == Some(5))
        .cloned()
        .unwrap();
    assert_eq!(five.severity, Severity::Critical);
    assert!(five.consequence_of.is_none(), "{five:#?}");
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    store.sessions = s;
    store.jobs = jobs;
    let snap = Snapshot::build(&store, "h", 0.0);
    let f = snap.jobs[0].first_failure.as_ref().unwrap();
    assert_eq!((f.rank, f.kind, f.ts), (Some(5), Kind::Oom, 100.0));
    let three = snap.jobs[0]
        .consequences
        .iter()
        .find(|c| c.rank == Some(3))
        .unwrap();
    assert_eq!((three.kind, three.ts), (Kind::Oom, 101.0));
}

#[test]
fn an_event_dated_after_the_sessions_last_line_keeps_its_time() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let keys = job_of_8(&mut s, &mut jobs);
    let clamped = s.timestamps_clamped;
    s.event(keys[2], oom(30.5));
    s.close(&mut jobs, keys[2], Ending::Crash, 31.0);
    assert_eq!(s.timestamps_clamped, clamped);
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    store.sessions = s;
    store.jobs = jobs;
    let snap = Snapshot::build(&store, "h", 0.0);
    let f = snap.jobs[0].first_failure.as_ref().unwrap();
    assert_eq!((f.rank, f.ts), (Some(2), 30.5));
}

#[test]
fn a_rank_whose_process_also_holds_memory_on_another_gpu_is_named() {
    use crate::core::model::NodeReading;
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    let keys = job_of_8(&mut store.sessions, &mut store.jobs);
    // Rank 3's process made a CUDA context on GPU-0 as well as on its own GPU-3; a process
    // outside the job uses GPU-0 too and is not counted.
    let mut stray = super::nvml::tests::process(peer(3).pid, "GPU-0", 500 << 20);
    stray.gpu = 0;
    let mut own = super::nvml::tests::process(peer(3).pid, "GPU-3", 30 * GIB);
    own.gpu = 3;
    let other = super::nvml::tests::process(99_999, "GPU-0", GIB);
    store.apply(
        NodeReading {
            ts: 30.0,
            driver_version: None,
            gpus: vec![],
            processes: vec![stray, own, other],
        },
        0.001,
    );
    let snap = Snapshot::build(&store, "h", 0.0);
    let m = &snap.jobs[0].memory;
    assert_eq!(m.stray.len(), 1, "{:?}", m.stray);
    assert_eq!(m.stray[0].rank, Some(3));
    assert_eq!(
        (m.stray[0].stray.gpu_uuid.as_str(), m.stray[0].stray.bytes),
        ("GPU-0", 500 << 20)
    );
    // Once rank 3 ended, nothing is named.
    store.close(keys[3], Ending::Clean, 40.0);
    let snap = Snapshot::build(&store, "h", 0.0);
    assert!(snap.jobs[0].memory.stray.is_empty());
}
