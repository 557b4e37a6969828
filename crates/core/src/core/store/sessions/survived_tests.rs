//! An OOM the trainer caught and went on from is a warning that says so; one followed by the
//! trainer's death stays critical, and the crash finding fires as before.

use super::*;
use crate::core::detect::explanation::{Explanation, Pattern};
use crate::core::detect::findings::Severity;
use crate::core::detect::{Finding, FindingState, Kind};

const GIB: u64 = 1 << 30;
const PEER: Peer = Peer {
    pid: 10,
    uid: 0,
    gid: 0,
};

fn fragmentation() -> Explanation {
    serde_json::from_str(include_str!(
        "../../../../../../tests/fixtures/oom/fragmentation.json"
    ))
    .unwrap()
}

fn sample(step: u64) -> Sample {
    Sample {
        ts: 100.0 + step as f64,
        step: Some(step),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(GIB),
            reserved: Some(3 * GIB),
            ..Stats::default()
        },
        device_free: Some(70 * GIB),
        device_total: Some(80 * GIB),
        alloc_limit: None,
        categories: None,
    }
}

fn oom(ts: f64, explanation: Option<Explanation>) -> Event {
    Event {
        ts,
        kind: "oom".into(),
        alloc_bytes: Some(1_610_612_736),
        device_free: Some(70 * GIB),
        alloc_limit: Some(4 * GIB),
        phase: None,
        detail: None,
        path: None,
        dropped: None,
        explanation: explanation.map(Box::new),
        ending: None,
    }
}

/// A session with samples to step 220 and then an OOM with the real explanation.
fn after_oom() -> (Sessions, Jobs, u64) {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let hello = Hello {
        v: 1,
        job: Some("j".into()),
        ..Hello::default()
    };
    let (key, _) = s.open(&mut jobs, PEER, hello, 100.0);
    for step in 210..=220 {
        s.sample(key, sample(step), 100.0 + step as f64);
    }
    s.event(key, oom(320.5, Some(fragmentation())));
    (s, jobs, key)
}

fn oom_finding(s: &Sessions) -> Finding {
    s.live()
        .chain(s.ended())
        .flat_map(|x| x.detect.current())
        .chain(s.findings.held())
        .chain(s.findings.recent())
        .find(|f| f.kind == Kind::Oom)
        .cloned()
        .unwrap()
}

#[test]
fn an_oom_the_run_went_on_from_is_a_warning_that_says_so() {
    let (mut s, _, key) = after_oom();
    let f = oom_finding(&s);
    assert_eq!(
        (f.state, f.severity),
        (FindingState::Firing, Severity::Critical)
    );
    assert_eq!(f.evidence.survived, None);
    let x = f.evidence.explanation.as_deref().unwrap();
    assert_eq!(x.pattern, Pattern::Fragmentation);
    assert!(f.message.starts_with(
        "CUDA out of memory (fragmentation): tried to allocate 1.5 GiB at oomlib.py:37"
    ));
    assert_eq!(s.findings.drain().len(), 1, "fired");

    s.sample(key, sample(221), 321.0);
    let f = oom_finding(&s);
    assert_eq!(
        (f.state, f.severity),
        (FindingState::Firing, Severity::Warning)
    );
    assert_eq!(f.evidence.survived, Some(true));
    assert!(
        f.message.ends_with("; the run went on (step 221)"),
        "{}",
        f.message
    );
    let posted = s.findings.drain();
    assert_eq!(posted.len(), 1, "the sinks hear of the downgrade");
    assert_eq!(posted[0].severity, Severity::Warning);
    // Further samples change nothing and post nothing.
    for step in 222..240 {
        s.sample(key, sample(step), 100.0 + step as f64);
    }
    assert!(s.findings.drain().is_empty());
    let log = &s.live().next().unwrap().oom_log;
    assert_eq!(log.ooms.len(), 1);
    assert!(log.ooms[0].survived && log.ooms[0].survived_step == Some(221));
    assert_eq!(log.ooms[0].step, Some(220));
    // Another OOM is critical again until the run goes on from it too.
    s.event(key, oom(400.0, None));
    let f = oom_finding(&s);
    assert_eq!(
        (f.severity, f.evidence.survived),
        (Severity::Critical, None)
    );
    let log = &s.live().next().unwrap().oom_log;
    assert_eq!(log.ooms.len(), 2);
    assert!(!log.ooms[0].survived && log.ooms[1].survived);
    assert!(log.ooms[0].explanation.is_none() && log.ooms[1].explanation.is_none());
}

#[test]
fn an_oom_followed_by_the_trainer_s_death_stays_critical() {
    let (mut s, mut jobs, key) = after_oom();
    s.close(&mut jobs, key, Ending::Crash, 322.0);
    // The OOM is what the trainer died of: it stays firing after the session (the cause), and
    // the crash it was followed by is a warning pointing at it, so one alert pages, not two.
    let f = oom_finding(&s);
    assert_eq!(
        (f.state, f.severity),
        (FindingState::Firing, Severity::Critical)
    );
    assert!(s.firing().any(|x| x.id == f.id));
    assert_eq!(f.evidence.survived, None);
    assert!(!f.message.contains("went on"));
    let crash = s.firing().find(|f| f.kind == Kind::Crash).unwrap();
    assert_eq!(crash.severity, Severity::Warning);
    assert_eq!(
        crash.consequence_of.as_ref().map(|c| c.kind),
        Some(Kind::Oom)
    );
    assert!(
        crash.message.ends_with("; after its own oom"),
        "{}",
        crash.message
    );
    // Held like a crash: resolved once the hold has passed.
    s.tick(322.0 + 600.0);
    assert!(s.firing().next().is_none());
    let log = &s.ended().next().unwrap().oom_log;
    assert!(!log.ooms[0].survived && log.ooms[0].explanation.is_some());
}

#[test]
fn the_snapshot_lists_ooms_without_the_explanation_and_the_session_entry_keeps_it() {
    use crate::core::snapshot::{SessionEntry, Snapshot};
    use crate::core::store::{HistoryLimits, Store};
    let (sessions, jobs, _) = after_oom();
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    store.sessions = sessions;
    store.jobs = jobs;
    let snap = serde_json::to_value(Snapshot::build(&store, "h", 60.0)).unwrap();
    let o = &snap["sessions"][0]["ooms"][0];
    assert_eq!(o["pattern"], "fragmentation");
    assert_eq!(o["failing_site"], "oomlib.py:37");
    assert_eq!(o["top_live_site"], "oomlib.py:32");
    assert!(o.get("explanation").is_none(), "{o}");
    // The oom finding's evidence still carries it, and so does the session's own entry.
    let findings = snap["findings"].as_array().unwrap();
    assert!(findings
        .iter()
        .any(|f| f["evidence"]["explanation"]["pattern"] == "fragmentation"));
    let id = store.sessions.live().next().unwrap().id.clone();
    let one = serde_json::to_value(SessionEntry::lookup(&store, &id).unwrap()).unwrap();
    assert_eq!(one["ooms"][0]["explanation"]["pattern"], "fragmentation");
    assert_eq!(one["ooms"][0]["top_live_site"], "oomlib.py:32");
}
