//! How a trainer said it ends decides what its close without bye is: a signal it received is a
//! stop (a warning, `stopped`), an exception names itself on the crash, and nothing said is a
//! crash as before. torchrun's teardown after one rank raised stays that rank's consequence.

use super::*;
use crate::core::detect::findings::Severity;
use crate::core::detect::{crash, Finding, Kind};
use crate::core::jobs::JobState;

fn hello(rank: u64) -> Hello {
    Hello {
        v: 1,
        job: Some("llama".into()),
        run_id: Some("r1".into()),
        rank: Some(rank),
        world_size: Some(4),
        ..Hello::default()
    }
}

fn peer(rank: u64) -> Peer {
    Peer {
        pid: 1000 + rank as u32,
        uid: 1000,
        gid: 1000,
    }
}

fn mark(ts: f64, detail: &str, ending: Option<Exit>) -> Event {
    Event {
        ts,
        kind: EventKind::Mark,
        alloc_bytes: None,
        device_free: None,
        alloc_limit: None,
        phase: None,
        detail: Some(detail.into()),
        path: None,
        dropped: None,
        explanation: None,
        ending,
    }
}

fn signal(ts: f64, name: &str) -> Event {
    let detail = format!("trainer got {name}");
    mark(ts, &detail, Some(Exit::Signal(name.into())))
}

fn ending_of(s: &Sessions, rank: u64) -> Finding {
    let f = s.firing().find(|f| f.subject.rank == Some(rank));
    f.cloned()
        .unwrap_or_else(|| panic!("no finding for rank {rank}"))
}

fn job_view(jobs: &Jobs) -> crate::core::jobs::JobView {
    let j = jobs.iter().next().expect("a job");
    crate::core::jobs::verdict::verdict(j.basis(|r| crate::core::jobs::bare(r, None)), jobs.rules())
}

#[test]
fn a_trainer_stopped_by_a_signal_is_stopped_not_crashed() {
    for sig in ["SIGINT", "SIGTERM", "SIGHUP"] {
        let mut s = Sessions::new(SessionLimits::default());
        let mut jobs = Jobs::default();
        let k = s.open(&mut jobs, peer(0), hello(0), 10.0).0;
        s.event(k, signal(20.0, sig));
        s.close(&mut jobs, k, Ending::Crash, 20.1);
        let f = ending_of(&s, 0);
        assert_eq!((f.kind, f.severity), (Kind::Stopped, Severity::Warning));
        assert_eq!(f.evidence.signal.as_deref(), Some(sig));
        assert_eq!(f.message, format!("the trainer was stopped by {sig}"));
        assert!(s.firing().all(|f| f.kind != Kind::Crash));
        let v = job_view(&jobs);
        assert_eq!(v.state, JobState::Stopped);
        assert_eq!(v.stop.and_then(|x| x.signal).as_deref(), Some(sig));
        assert!(jobs.failed_ranks(20.2, 600.0).is_empty());
    }
}

#[test]
fn a_signal_long_before_the_end_is_not_what_ended_it() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let k = s.open(&mut jobs, peer(0), hello(0), 10.0).0;
    s.event(k, signal(20.0, "SIGHUP"));
    s.close(
        &mut jobs,
        k,
        Ending::Crash,
        20.0 + crash::STOP_GRACE_SECONDS + 1.0,
    );
    let f = ending_of(&s, 0);
    assert_eq!((f.kind, f.severity), (Kind::Crash, Severity::Critical));
}

#[test]
fn an_exception_names_itself_on_the_crash_and_in_the_verdict() {
    // The reference client's mark, and an older client's (no `ending`): both are read.
    let new = Exit::Exception("RuntimeError: boom".into());
    for ending in [Some(new), None] {
        let mut s = Sessions::new(SessionLimits::default());
        let mut jobs = Jobs::default();
        let k = s.open(&mut jobs, peer(0), hello(0), 10.0).0;
        s.event(k, mark(20.0, "trainer died: RuntimeError: boom", ending));
        s.close(&mut jobs, k, Ending::Crash, 20.1);
        let f = ending_of(&s, 0);
        assert_eq!((f.kind, f.severity), (Kind::Crash, Severity::Critical));
        assert_eq!(f.message, "the trainer died of RuntimeError: boom");
        let v = job_view(&jobs);
        assert_eq!(v.state, JobState::Failed);
        let first = v.first_failure.expect("a failure");
        assert_eq!(first.exception.as_deref(), Some("RuntimeError: boom"));
    }
}

#[test]
fn torchruns_teardown_after_one_rank_raised_follows_that_rank() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let keys: Vec<u64> = (0..4)
        .map(|r| s.open(&mut jobs, peer(r), hello(r), 10.0).0)
        .collect();
    let died = Exit::Exception("ValueError: bad batch".into());
    s.event(
        keys[2],
        mark(30.0, "trainer died: ValueError: bad batch", Some(died)),
    );
    s.close(&mut jobs, keys[2], Ending::Crash, 30.1);
    for r in [0, 1, 3] {
        s.event(keys[r], signal(31.0, "SIGTERM"));
        s.close(&mut jobs, keys[r], Ending::Crash, 31.2);
    }
    let critical: Vec<Finding> = s
        .firing()
        .filter(|f| f.severity == Severity::Critical)
        .cloned()
        .collect();
    assert_eq!(critical.len(), 1, "{critical:#?}");
    assert_eq!(critical[0].subject.rank, Some(2));
    for r in [0, 1, 3] {
        let f = ending_of(&s, r);
        assert_eq!((f.kind, f.severity), (Kind::Stopped, Severity::Warning));
        let of = f.consequence_of.expect("a consequence");
        assert_eq!((of.rank, of.kind), (Some(2), Kind::Crash));
    }
    let v = job_view(&jobs);
    assert_eq!(v.state, JobState::Failed);
    assert_eq!(
        crate::core::jobs::verdict::summary(&v),
        "failed: rank 2 crash (ValueError: bad batch), then 3 ranks within 1.1 s"
    );
    // Only the rank that raised is a failed rank for the job alert.
    let failed: Vec<_> = jobs.failed_ranks(32.0, 600.0);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].1.rank, Some(2));
}
