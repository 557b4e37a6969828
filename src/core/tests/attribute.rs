//! store::sessions' attribution requests and answers, checked by the reply the trainer gets.

use crate::core::detect::attribution::{Attribution, Site};
use crate::core::detect::{Finding, FindingState, Kind};
use crate::core::jobs::Jobs;
use crate::core::store::sessions::{
    steps_for, AttributionPolicy, Request, Session, SessionLimits, Sessions,
};
use crate::core::trainer::{Ending, Peer};
use crate::core::trainer::{Hello, Sample, Stats};
// The connection turns an unasked answer into this reply; the tests check what the trainer sees.
use crate::sources::ingest::protocol::{Code, Rejection};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const T0: f64 = 1_763_700_000.0;
const PEER: Peer = Peer {
    pid: 42,
    uid: 1000,
    gid: 1000,
};

fn hello(caps: &[&str]) -> Hello {
    Hello {
        v: 1,
        ns_pid: Some(42),
        job: Some("ft".into()),
        rank: Some(0),
        cuda_device: Some(0),
        gpu_uuid: Some("GPU-1".into()),
        caps: caps.iter().map(|c| c.to_string()).collect(),
        ..Hello::default()
    }
}

/// Step `step` of a trainer whose floor grows `slope` bytes a step on a 16 GiB device, ten
/// steps a second.
fn sample(step: u64, slope: u64) -> Sample {
    let floor = 2 * GIB + step * slope;
    Sample {
        ts: ts(step),
        step: Some(step),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(floor),
            allocated_peak: Some(floor + GIB),
            reserved: Some(floor + GIB),
            ..Stats::default()
        },
        device_free: Some(16 * GIB - floor - GIB),
        device_total: Some(16 * GIB),
        alloc_limit: None,
        categories: None,
    }
}

fn ts(step: u64) -> f64 {
    T0 + step as f64 * 0.1
}

struct Rig {
    s: Sessions,
    /// The jobs its session is a rank of (none: it names no job).
    jobs: Jobs,
    key: u64,
    step: u64,
    requests: Vec<(u64, Request)>,
}

impl Rig {
    fn live(caps: &[&str], policy: AttributionPolicy) -> Self {
        Self::with(
            Sessions::new(SessionLimits::default()).with_attribution(policy),
            caps,
        )
    }

    fn with(mut s: Sessions, caps: &[&str]) -> Self {
        let mut jobs = Jobs::default();
        let (key, _) = s.open(&mut jobs, PEER, hello(caps), T0);
        Self {
            s,
            jobs,
            key,
            step: 0,
            requests: Vec::new(),
        }
    }

    /// `n` more steps growing `slope` bytes each; the daemon asks after every one, as the
    /// connection does after every batch, with the sample's time as its clock.
    fn run(&mut self, n: u64, slope: u64) {
        for _ in 0..n {
            self.step += 1;
            self.s
                .sample(self.key, sample(self.step, slope), ts(self.step));
            if let Some(r) = self.s.request_due(self.key, ts(self.step)) {
                self.requests.push((self.step, r));
            }
        }
    }

    /// Runs a 4 MiB/step leak until its finding is raised; returns the step.
    fn until_leak(&mut self) -> u64 {
        for _ in 0..2000 {
            self.run(1, 4 * MIB);
            if self.leak().is_some() {
                return self.step;
            }
        }
        panic!("no leak raised");
    }

    fn sess(&self) -> &Session {
        self.s
            .live()
            .next()
            .or_else(|| self.s.ended().last())
            .unwrap()
    }

    fn leak(&self) -> Option<&Finding> {
        self.sess().detect.leak()
    }

    fn events(&self, kind: &str) -> Vec<String> {
        self.sess()
            .events
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.detail.clone().unwrap_or_default())
            .collect()
    }

    fn answer(&mut self, a: Attribution) -> Result<(), Rejection> {
        self.s.attribution(self.key, a).map_err(Rejection::from)
    }
}

/// 93 of 100 MiB grown at train.py:27 in steps 610–730.
fn found(id: u64) -> Attribution {
    Attribution {
        id,
        ts: T0 + 1000.0,
        finding: None,
        step_from: Some(610),
        step_to: Some(730),
        seconds: Some(12.0),
        total_growth_bytes: 100 * MIB,
        sites: vec![
            Site {
                file: "/home/alice/proj/train.py".into(),
                line: 27,
                function: "kept_outputs".into(),
                bytes: 93 * MIB,
                blocks: 120,
                stack: vec![],
                note: None,
            },
            Site {
                file: "/home/alice/proj/data.py".into(),
                line: 9,
                function: "load".into(),
                bytes: 7 * MIB,
                blocks: 3,
                stack: vec![],
                note: None,
            },
        ],
        error: None,
        detail: None,
    }
}

fn failed(id: u64, error: &str) -> Attribution {
    Attribution {
        sites: vec![],
        total_growth_bytes: 0,
        error: Some(error.into()),
        detail: Some("torch.cuda is not available".into()),
        ..found(id)
    }
}

fn quick_cooldown() -> AttributionPolicy {
    AttributionPolicy {
        cooldown_seconds: 30.0,
        ..AttributionPolicy::default()
    }
}

#[test]
fn a_capable_session_is_asked_once_when_its_leak_is_raised() {
    let mut r = Rig::live(&["attribution"], AttributionPolicy::default());
    let raised = r.until_leak();
    assert!(raised > 256, "raised after the warm-up, at {raised}");
    assert_eq!(r.requests.len(), 1);
    let (at, req) = &r.requests[0];
    assert_eq!(*at, raised, "asked in the same batch the finding appeared");
    assert_eq!(
        req,
        &Request {
            id: 1,
            finding: "s-1/leak".into(),
            // 32 MiB at 4 MiB/step is 8 steps: raised to the least window.
            steps: 20,
            seconds: 120.0,
            max_entries: 4000,
            top: 10,
        }
    );
    assert_eq!(r.sess().asking.open(), Some((1, "s-1/leak")));
    let asked = r.events("attribution_requested");
    assert_eq!(asked.len(), 1);
    assert!(
        asked[0].contains("20 steps or 120 s") && asked[0].contains("s-1/leak"),
        "{asked:?}"
    );
    // One window at a time: the leak keeps firing, nothing more is asked.
    r.run(500, 4 * MIB);
    assert_eq!(r.requests.len(), 1);
}

#[test]
fn sessions_that_cannot_answer_or_a_disabled_policy_are_never_asked() {
    for (caps, policy) in [
        (&[][..], AttributionPolicy::default()),
        (&["teleport"][..], AttributionPolicy::default()),
        (
            &["attribution"][..],
            AttributionPolicy {
                enabled: false,
                ..AttributionPolicy::default()
            },
        ),
    ] {
        let mut r = Rig::live(caps, policy);
        r.until_leak();
        r.run(3000, 4 * MIB);
        assert_eq!(r.leak().map(|f| f.state), Some(FindingState::Firing));
        assert!(r.requests.is_empty(), "{caps:?} {policy:?}");
        assert!(r.events("attribution_requested").is_empty());
        // The leak says why it names no line, through every refresh since.
        let why = if policy.enabled {
            "; no line is named: the trainer's client does not record allocation history (its hello announced no `attribution`)"
        } else {
            "; no line is named: attribution is off in the daemon's config ([attribution] enabled = false)"
        };
        let message = &r.leak().unwrap().message;
        assert!(
            says_before_forecast(message, why),
            "{caps:?} {policy:?}: {message}"
        );
    }
    // A replay's sessions (gpumon analyze: `Sessions::new` alone) ask as the daemon's default
    // policy asks; the replay drops the requests, and the recorded answers find them.
    let mut replay = Rig::with(Sessions::new(SessionLimits::default()), &["attribution"]);
    let mut live = Rig::live(&["attribution"], AttributionPolicy::default());
    replay.until_leak();
    live.until_leak();
    replay.run(100, 4 * MIB);
    live.run(100, 4 * MIB);
    assert!(!replay.requests.is_empty());
    assert_eq!(replay.requests, live.requests);
}

#[test]
fn an_answer_goes_on_the_finding_through_refreshes_and_into_its_resolved_record() {
    let mut r = Rig::live(&["attribution"], AttributionPolicy::default());
    r.until_leak();
    r.s.findings.drain();
    r.answer(found(1)).unwrap();
    let f = r.leak().unwrap().clone();
    let a = f.attribution.as_ref().unwrap();
    assert_eq!(a.finding.as_deref(), Some("s-1/leak"));
    assert_eq!(a.top().unwrap().short(), "train.py:27");
    assert!(
        f.message.contains("train.py:27") && f.message.contains("kept_outputs"),
        "{}",
        f.message
    );
    assert!(
        f.message.starts_with("allocated floor grows"),
        "{}",
        f.message
    );
    // The sinks see the site.
    let posted = r.s.findings.drain();
    assert!(
        posted
            .iter()
            .any(|p| p.id == "s-1/leak" && p.attribution.is_some()),
        "{posted:?}"
    );
    assert_eq!(r.sess().asking.open(), None);
    assert_eq!(
        r.sess()
            .attribution
            .as_ref()
            .and_then(|a| a.finding.clone()),
        Some("s-1/leak".into())
    );
    assert_eq!(
        r.events("attribution"),
        ["93% at train.py:27 in kept_outputs"]
    );

    // Evidence is rebuilt on every evaluation; the attribution and the site in the message stay.
    let before = r.leak().unwrap().evidence.clone();
    r.run(400, 4 * MIB);
    let f = r.leak().unwrap();
    assert_ne!(f.evidence, before, "the evidence was refreshed");
    assert_eq!(f.attribution.as_ref(), Some(a));
    assert!(f.message.contains("train.py:27"), "{}", f.message);
    // It has its attribution: it is not asked about again.
    assert_eq!(r.requests.len(), 1);

    r.s.close(&mut r.jobs, r.key, Ending::Clean, ts(r.step) + 1.0);
    let resolved = r.s.findings.recent().last().unwrap();
    assert_eq!(
        (resolved.kind, resolved.state),
        (Kind::Leak, FindingState::Resolved)
    );
    assert_eq!(resolved.attribution.as_ref(), Some(a));
    assert!(resolved.message.contains("train.py:27"));
}

#[test]
fn an_answer_to_no_open_request_is_refused_and_changes_nothing() {
    let mut r = Rig::live(&["attribution"], AttributionPolicy::default());
    // Before anything was asked.
    let err = r.answer(found(1)).unwrap_err();
    assert_eq!(err.code, Code::BadField);
    assert!(
        err.message.contains("id 1 answers no open request"),
        "{}",
        err.message
    );
    r.until_leak();
    r.s.findings.drain();
    let events = r.sess().events.len();
    // A wrong id while one is open.
    let err = r.answer(found(7)).unwrap_err();
    assert!(err.message.contains("id 7"), "{}", err.message);
    assert_eq!(r.sess().asking.open(), Some((1, "s-1/leak")));
    assert!(r.leak().unwrap().attribution.is_none());
    assert!(r.sess().attribution.is_none());
    assert_eq!(r.sess().events.len(), events);
    assert!(r.s.findings.drain().is_empty());
    // The right one, then the same again: answered already.
    r.answer(found(1)).unwrap();
    assert_eq!(r.answer(found(1)).unwrap_err().code, Code::BadField);
}

#[test]
fn a_failed_window_is_retried_after_the_cool_down_only() {
    let mut r = Rig::live(&["attribution"], quick_cooldown());
    r.until_leak();
    let asked_at = ts(r.step);
    r.answer(failed(1, "failed")).unwrap();
    assert_eq!(
        r.events("attribution_failed"),
        ["failed: torch.cuda is not available"]
    );
    assert!(r.leak().unwrap().attribution.is_none());
    assert_eq!(
        r.sess().attribution.as_ref().and_then(|a| a.error.clone()),
        Some("failed".into())
    );
    // 29.9 s later: still cooling down; 30 s: asked again.
    r.run(299, 4 * MIB);
    assert_eq!(r.requests.len(), 1);
    r.run(1, 4 * MIB);
    assert_eq!(r.requests.len(), 2);
    assert!((ts(r.requests[1].0) - asked_at - 30.0).abs() < 1e-6);
    assert_eq!(r.requests[1].1.id, 2);
}

#[test]
fn an_unanswered_window_fails_at_its_deadline() {
    let mut r = Rig::live(&["attribution"], AttributionPolicy::default());
    r.until_leak();
    let t = ts(r.step);
    // The deadline is twice the window's 120 s plus a minute.
    assert_eq!(r.s.request_due(r.key, t + 299.0), None);
    assert_eq!(r.sess().asking.open(), Some((1, "s-1/leak")));
    assert!(r.events("attribution_failed").is_empty());
    assert_eq!(r.s.request_due(r.key, t + 301.0), None, "cooling down");
    assert_eq!(r.sess().asking.open(), None);
    let failed = r.events("attribution_failed");
    assert_eq!(failed.len(), 1);
    assert!(failed[0].starts_with("no answer: request 1"), "{failed:?}");
    // A late answer answers nothing.
    assert_eq!(r.answer(found(1)).unwrap_err().code, Code::BadField);
    assert!(r.leak().unwrap().attribution.is_none());
    // After the cool-down (600 s from the request) it is asked again.
    assert_eq!(r.s.request_due(r.key, t + 599.0), None);
    let again = r.s.request_due(r.key, t + 600.0).unwrap();
    assert_eq!((again.id, again.finding.as_str()), (2, "s-1/leak"));
}

#[test]
fn a_trainer_that_cannot_attribute_is_not_asked_again() {
    let mut r = Rig::live(&["attribution"], quick_cooldown());
    r.until_leak();
    r.answer(failed(1, "unavailable")).unwrap();
    assert_eq!(
        r.events("attribution_failed"),
        ["unavailable: torch.cuda is not available"]
    );
    r.run(2000, 4 * MIB);
    assert_eq!(r.requests.len(), 1);
    assert!(r.s.request_due(r.key, ts(r.step) + 1e5).is_none());
    assert!(r.leak().unwrap().attribution.is_none());
    // Its answer, not "cannot be asked", says why no line is named, through every refresh.
    let message = &r.leak().unwrap().message;
    assert!(
        says_before_forecast(message, "; no line is named: the trainer cannot record allocation history (torch.cuda is not available)"),
        "{message}"
    );
}

/// `message` has `clause`, before its forecast when it has one (a cut keeps the last clause,
/// and the time left matters more).
fn says_before_forecast(message: &str, clause: &str) -> bool {
    match (message.find(clause), message.find("; at this rate ")) {
        (Some(at), Some(forecast)) => at < forecast,
        (Some(at), None) => message.ends_with(clause) && at > 0,
        (None, _) => false,
    }
}

#[test]
fn a_trainer_that_dies_mid_window_leaves_the_finding_as_it_was() {
    let mut r = Rig::live(&["attribution"], AttributionPolicy::default());
    r.until_leak();
    let message = r.leak().unwrap().message.clone();
    r.s.close(&mut r.jobs, r.key, Ending::Crash, ts(r.step) + 5.0);
    let leak =
        r.s.findings
            .recent()
            .find(|f| f.kind == Kind::Leak)
            .unwrap();
    assert_eq!(leak.attribution, None);
    assert_eq!(leak.message, message);
    let sess = r.s.ended().last().unwrap();
    assert!(sess.attribution.is_none());
    assert!(sess.events.iter().any(|e| e.kind == "attribution_failed"
        && e.detail
            .as_deref()
            .is_some_and(|d| d.starts_with("cut_short"))));
    assert_eq!(sess.events.back().unwrap().kind, "crash");
}

#[test]
fn a_replay_takes_a_recorded_answer_for_the_request_it_made_again() {
    // A replay has no mode of its own: an answer before the request it answers is refused,
    // as live; the request made again at the leak, as live, takes the recorded answer.
    let mut r = Rig::with(Sessions::new(SessionLimits::default()), &["attribution"]);
    assert!(r.answer(found(1)).is_err());
    r.until_leak();
    assert_eq!(r.requests.first().map(|(_, q)| q.id), Some(1));
    r.answer(found(1)).unwrap();
    let f = r.leak().unwrap();
    let a = f.attribution.as_ref().unwrap();
    assert_eq!((a.id, a.finding.as_deref()), (1, Some("s-1/leak")));
    assert!(f.message.contains("train.py:27"), "{}", f.message);
}

#[test]
fn a_leak_raised_again_is_asked_about_again() {
    // Answered for the first finding, which then resolves (the floor stops growing); a second
    // leak finding has no attribution, so it is asked about once the cool-down has passed.
    let mut r = Rig::live(&["attribution"], quick_cooldown());
    r.until_leak();
    r.answer(found(1)).unwrap();
    let mut resolved_at = None;
    for _ in 0..20_000 {
        r.run(1, 0);
        if r.leak().is_none() {
            resolved_at = Some(r.step);
            break;
        }
    }
    let resolved_at = resolved_at.expect("the leak resolved on a flat floor");
    assert!(r
        .s
        .findings
        .recent()
        .any(|f| f.id == "s-1/leak" && f.attribution.is_some()));
    for _ in 0..20_000 {
        r.run(1, 4 * MIB);
        if r.requests.len() == 2 {
            break;
        }
    }
    let (at, req) = &r.requests[1];
    assert!(*at > resolved_at);
    assert_eq!((req.id, req.finding.as_str()), (2, "s-1/leak#2"));
}

#[test]
fn steps_are_chosen_for_about_32_mib_of_growth() {
    let mib = MIB as f64;
    assert_eq!(steps_for(Some(mib), 200), 32);
    assert_eq!(steps_for(Some(0.3 * mib), 200), 107);
    assert_eq!(steps_for(Some(4.0 * mib), 200), 20);
    assert_eq!(steps_for(Some(1024.0), 200), 200);
    assert_eq!(steps_for(None, 200), 200);
    assert_eq!(steps_for(Some(-5.0), 200), 200);
    assert_eq!(steps_for(Some(f64::NAN), 200), 200);
    // A window configured under the least is the window.
    assert_eq!(steps_for(Some(4.0 * mib), 10), 10);
}
