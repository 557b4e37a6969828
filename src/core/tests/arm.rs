//! store::sessions' OOM arming (armed, peak), checked by the reply the trainer gets.

use crate::core::detect::attribution::{Frame, Site};
use crate::core::detect::peak::Peak;
use crate::core::detect::{Finding, FindingState, Kind};
use crate::core::jobs::Jobs;
use crate::core::store::sessions::{
    ArmAnswer, ArmLine, ArmReason, ArmRequest, Armed, AttributionPolicy, OomPolicy, Session,
    SessionLimits, Sessions,
};
use crate::core::trainer::{Ending, Hello, Peer, Sample, Stats};
use crate::sources::ingest::protocol::{Code, Rejection};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const T0: f64 = 1_763_700_000.0;
const CAP: u64 = 4 * GIB;
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
        alloc_limit: Some(CAP),
        caps: caps.iter().map(|c| c.to_string()).collect(),
        ..Hello::default()
    }
}

/// One step a second under a 4 GiB cap: the step peak `peak` bytes, nothing growing.
fn capped(step: u64, peak: u64) -> Sample {
    Sample {
        ts: T0 + step as f64,
        step: Some(step),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(GIB),
            allocated_peak: Some(peak),
            reserved: Some(peak),
            ..Stats::default()
        },
        device_free: Some(70 * GIB),
        device_total: Some(80 * GIB),
        alloc_limit: None,
        categories: None,
    }
}

/// The step peak 10 MiB under the cap: near_limit.
fn tight(step: u64) -> Sample {
    capped(step, CAP - 10 * MIB)
}

/// The step peak at half the cap: room.
fn roomy(step: u64) -> Sample {
    capped(step, 2 * GIB)
}

struct Rig {
    s: Sessions,
    /// The jobs its session is a rank of (none: it names no job).
    jobs: Jobs,
    key: u64,
    step: u64,
    lines: Vec<(u64, ArmLine)>,
}

impl Rig {
    fn live(caps: &[&str], policy: OomPolicy) -> Self {
        let mut s = Sessions::new(SessionLimits::default()).with_arming(policy);
        let mut jobs = Jobs::default();
        let (key, _) = s.open(&mut jobs, PEER, hello(caps), T0);
        Self {
            s,
            jobs,
            key,
            step: 0,
            lines: Vec::new(),
        }
    }

    fn capable() -> Self {
        Self::live(&["oom_history"], OomPolicy::default())
    }

    /// `n` more steps from `sample`; the daemon looks after every one, as the connection does
    /// after every batch, with the sample's time as its clock.
    fn run(&mut self, n: u64, sample: fn(u64) -> Sample) {
        for _ in 0..n {
            self.step += 1;
            let s = sample(self.step);
            let now = s.ts;
            self.s.sample(self.key, s, now);
            if let Some(l) = self.s.arm_due(self.key, now) {
                self.lines.push((self.step, l));
            }
        }
    }

    /// Tight steps until near_limit fires; returns the step.
    fn until_near_limit(&mut self) -> u64 {
        for _ in 0..100 {
            self.run(1, tight);
            if self
                .near_limit()
                .is_some_and(|f| f.state == FindingState::Firing)
            {
                return self.step;
            }
        }
        panic!("near_limit never fired");
    }

    /// Roomy steps until near_limit resolves; returns the step.
    fn until_resolved(&mut self) -> u64 {
        for _ in 0..1000 {
            self.run(1, roomy);
            if self.near_limit().is_none() {
                return self.step;
            }
        }
        panic!("near_limit never resolved");
    }

    fn sess(&self) -> &Session {
        self.s.live().next().unwrap()
    }

    fn near_limit(&self) -> Option<&Finding> {
        self.sess().detect.near_limit()
    }

    fn armed(&self) -> Option<&Armed> {
        self.sess().arming.armed()
    }

    fn arms(&self) -> Vec<&ArmRequest> {
        self.lines
            .iter()
            .filter_map(|(_, l)| match l {
                ArmLine::Arm(r) => Some(r),
                ArmLine::Disarm { .. } => None,
            })
            .collect()
    }

    fn events(&self, kind: &str) -> Vec<String> {
        self.sess()
            .events
            .iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.detail.clone().unwrap_or_default())
            .collect()
    }

    fn answer(&mut self, id: u64, error: Option<&str>) -> Result<(), Rejection> {
        let a = ArmAnswer {
            id,
            ts: T0 + self.step as f64,
            error: error.map(str::to_string),
            detail: error.map(|_| "CUDA is not available".to_string()),
        };
        self.s.armed(self.key, a).map_err(Rejection::from)
    }

    fn peak(&mut self, p: Peak) -> Result<(), Rejection> {
        self.s.peak(self.key, p).map_err(Rejection::from)
    }
}

/// 2 GiB of a 4 GiB peak at model.py:88 in attention.
fn attention(id: u64) -> Peak {
    let site = |line, function: &str, bytes| Site {
        file: "/home/alice/proj/model.py".into(),
        line,
        function: function.into(),
        bytes,
        blocks: 48,
        stack: vec![Frame {
            file: "/home/alice/proj/model.py".into(),
            line,
            function: function.into(),
        }],
        note: None,
    };
    Peak {
        id,
        ts: T0 + 50.0,
        finding: None,
        step_from: Some(10),
        step_to: Some(30),
        peak_bytes: CAP,
        sites: vec![site(88, "attention", 2 * GIB), site(61, "mlp", GIB)],
        error: None,
        detail: None,
    }
}

#[test]
fn near_limit_firing_arms_once_with_a_peak_asked() {
    let mut r = Rig::capable();
    let fired = r.until_near_limit();
    assert_eq!(
        r.lines,
        [(
            fired,
            ArmLine::Arm(ArmRequest {
                id: 1,
                finding: "s-1/near_limit".into(),
                seconds: 900.0,
                max_entries: 20_000,
                peak_after_steps: 20,
            })
        )],
        "armed in the batch it fired"
    );
    let armed = r.armed().unwrap().clone();
    assert_eq!(armed.reason, ArmReason::NearLimit);
    assert_eq!(
        (armed.since, armed.until),
        (T0 + fired as f64, T0 + fired as f64 + 900.0)
    );
    assert!(!armed.recording, "not until the trainer answers");
    // Still near the limit: not armed twice.
    r.run(50, tight);
    assert_eq!(r.lines.len(), 1);
    assert_eq!(r.events("arm_requested").len(), 1);
}

#[test]
fn the_answer_and_the_peak_go_on_the_near_limit_finding() {
    let mut r = Rig::capable();
    r.until_near_limit();
    // An answer to another request changes nothing.
    let err = r.answer(7, None).unwrap_err();
    assert_eq!(err.code, Code::BadField);
    assert!(err.message.contains("armed with id 7"), "{}", err.message);
    assert!(!r.armed().unwrap().recording);
    r.answer(1, None).unwrap();
    assert!(r.armed().unwrap().recording);
    assert!(r.answer(1, None).is_err(), "answered once");
    assert!(r.peak(attention(3)).is_err(), "a peak for no request");
    r.peak(attention(1)).unwrap();
    let f = r.near_limit().unwrap();
    let p = f.peak.as_ref().unwrap();
    assert_eq!(p.finding.as_deref(), Some("s-1/near_limit"));
    assert!(
        f.message.ends_with(
            "; at the step peak 50% of live memory (2.0 GiB) was allocated at model.py:88 in attention"
        ),
        "{}",
        f.message
    );
    // Refreshed by later samples, the message keeps naming the site.
    r.run(3, tight);
    assert!(r.near_limit().unwrap().message.contains("model.py:88"));
    assert!(r.peak(attention(1)).is_err(), "one peak per arming");
    assert_eq!(
        r.events("peak"),
        ["50% of the 4.0 GiB step peak at model.py:88 in attention"]
    );
}

#[test]
fn a_failed_peak_is_an_event_not_a_site() {
    let mut r = Rig::capable();
    r.until_near_limit();
    r.answer(1, None).unwrap();
    r.peak(Peak {
        sites: vec![],
        peak_bytes: 0,
        error: Some("failed".into()),
        detail: Some("snapshot raised".into()),
        ..attention(1)
    })
    .unwrap();
    assert!(r.near_limit().unwrap().peak.is_none());
    assert_eq!(r.events("peak_failed"), ["failed: snapshot raised"]);
}

#[test]
fn the_risk_passing_disarms_and_the_cooldown_holds_off_rearming() {
    let policy = OomPolicy {
        rearm_seconds: 600.0,
        ..OomPolicy::default()
    };
    let mut r = Rig::live(&["oom_history"], policy);
    r.until_near_limit();
    r.answer(1, None).unwrap();
    let resolved = r.until_resolved();
    assert_eq!(r.lines.last(), Some(&(resolved, ArmLine::Disarm { id: 1 })));
    assert!(r.armed().is_none());
    assert_eq!(r.events("disarmed").len(), 1);
    assert!(r.events("disarmed")[0].starts_with("the risk has passed"));
    // Near the limit again within the cool-down: not armed.
    let again = r.until_near_limit();
    assert!((again as f64) < 600.0, "fired again at {again}");
    assert_eq!(r.arms().len(), 1);
    // Once it has passed, armed again, with the next id.
    r.run(600, tight);
    let arms = r.arms();
    assert_eq!(arms.len(), 2);
    assert_eq!(arms[1].id, 2);
}

#[test]
fn an_arming_ends_at_its_time_cap() {
    let policy = OomPolicy {
        arm_seconds: 60.0,
        ..OomPolicy::default()
    };
    let mut r = Rig::live(&["oom_history"], policy);
    let fired = r.until_near_limit();
    r.answer(1, None).unwrap();
    r.run(59, tight);
    assert!(r.armed().is_some());
    r.run(1, tight);
    assert!(
        r.armed().is_none(),
        "over at since + 60 s (step {})",
        fired + 60
    );
    // The trainer stopped by itself: nothing is sent, and the cool-down still holds.
    assert_eq!(r.lines.len(), 1);
    assert!(
        r.events("disarmed")[0].starts_with("time cap"),
        "{:?}",
        r.events("disarmed")
    );
    r.run(100, tight);
    assert_eq!(r.lines.len(), 1);
    // Its peak, on its way when the cap ended it, is taken once, on the finding still firing.
    r.peak(attention(1)).unwrap();
    assert!(r.near_limit().unwrap().peak.is_some());
    assert!(r.peak(attention(1)).is_err(), "once");
    assert!(r.answer(1, None).is_err(), "it had answered armed already");
}

#[test]
fn late_answers_to_a_disarmed_request_are_taken_once() {
    let policy = OomPolicy {
        rearm_seconds: 600.0,
        ..OomPolicy::default()
    };
    let mut r = Rig::live(&["oom_history"], policy);
    r.until_near_limit();
    // Disarmed before the trainer's armed and peak arrive.
    r.until_resolved();
    assert!(r.armed().is_none());
    r.answer(1, None).unwrap();
    assert!(r.armed().is_none(), "a late armed does not reopen it");
    assert!(r.events("armed")[0].contains("after it ended"));
    assert!(r.answer(1, None).is_err(), "once");
    // The finding resolved: the peak is an event only.
    r.peak(attention(1)).unwrap();
    assert!(r.near_limit().is_none());
    assert_eq!(
        r.events("peak"),
        ["50% of the 4.0 GiB step peak at model.py:88 in attention"]
    );
    assert!(r.peak(attention(1)).is_err(), "once");
    assert!(r.peak(attention(2)).is_err(), "never asked");
}

#[test]
fn an_armed_error_is_its_only_answer() {
    let mut r = Rig::capable();
    r.until_near_limit();
    r.answer(1, Some("failed")).unwrap();
    assert!(r.armed().is_none());
    assert!(r.answer(1, Some("failed")).is_err(), "answered once");
    assert!(r.answer(1, None).is_err());
}

#[test]
fn unavailable_is_never_asked_again_and_failed_is_after_the_cooldown() {
    let quick = OomPolicy {
        rearm_seconds: 30.0,
        ..OomPolicy::default()
    };
    let mut r = Rig::live(&["oom_history"], quick);
    r.until_near_limit();
    r.answer(1, Some("failed")).unwrap();
    assert!(r.armed().is_none());
    r.run(40, tight);
    assert_eq!(r.arms().len(), 2, "failed: asked again after the cool-down");
    r.answer(2, Some("unavailable")).unwrap();
    assert_eq!(r.events("arm_failed").len(), 2);
    assert!(r.events("arm_failed")[1].starts_with("unavailable: CUDA"));
    r.run(500, tight);
    assert_eq!(r.arms().len(), 2, "unavailable: never again");
}

#[test]
fn sessions_without_the_capability_or_with_arming_off_are_never_armed() {
    for (caps, policy) in [
        (&["attribution"][..], OomPolicy::default()),
        (
            &["oom_history"][..],
            OomPolicy {
                arm: false,
                ..OomPolicy::default()
            },
        ),
    ] {
        let mut r = Rig::live(caps, policy);
        r.until_near_limit();
        r.run(20, tight);
        assert!(r.lines.is_empty() && r.armed().is_none(), "{caps:?}");
        assert!(r.answer(1, None).is_err(), "no arming to answer");
    }
}

/// Step `step` of a 4 MiB/step leak on a 16 GiB device, ten steps a second: its OOM is
/// forecast about five minutes out.
fn leaking(step: u64) -> Sample {
    let floor = 2 * GIB + step * 4 * MIB;
    Sample {
        ts: T0 + step as f64 * 0.1,
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

fn leak_rig(policy: OomPolicy) -> (Rig, Vec<crate::core::store::sessions::Request>) {
    let mut s = Sessions::new(SessionLimits::default())
        .with_attribution(AttributionPolicy::default())
        .with_arming(policy);
    let mut jobs = Jobs::default();
    let (key, _) = s.open(
        &mut jobs,
        PEER,
        Hello {
            alloc_limit: None,
            ..hello(&["attribution", "oom_history"])
        },
        T0,
    );
    let mut r = Rig {
        s,
        jobs,
        key,
        step: 0,
        lines: Vec::new(),
    };
    let mut asked = Vec::new();
    for _ in 0..1500 {
        r.step += 1;
        let s = leaking(r.step);
        let now = s.ts;
        r.s.sample(r.key, s, now);
        asked.extend(r.s.request_due(r.key, now));
        if let Some(l) = r.s.arm_due(r.key, now) {
            r.lines.push((r.step, l));
        }
    }
    (r, asked)
}

#[test]
fn a_leak_forecast_within_the_threshold_arms_without_a_peak() {
    let (r, asked) = leak_rig(OomPolicy::default());
    let leak = r.sess().detect.leak().unwrap();
    let eta = leak.evidence.oom_eta_seconds.unwrap();
    assert!(eta < 3600.0, "forecast {eta} s");
    let arms = r.arms();
    assert_eq!(arms.len(), 1);
    // One counter for both requests: the attribution asked first, then the arming.
    assert_eq!(asked[0].id, 1);
    assert_eq!(arms[0].id, 2);
    assert_eq!(arms[0].finding, leak.id);
    assert_eq!(arms[0].peak_after_steps, 0, "a leak asks no peak");
    assert_eq!(r.armed().unwrap().reason, ArmReason::LeakForecast);
    let mut r = r;
    assert!(r.peak(attention(2)).is_err(), "no peak was asked");
}

#[test]
fn a_leak_forecast_beyond_the_threshold_does_not_arm() {
    let (r, _) = leak_rig(OomPolicy {
        arm_eta_seconds: 10.0,
        ..OomPolicy::default()
    });
    assert!(r.sess().detect.leak().is_some());
    assert!(r.lines.is_empty());
}

#[test]
fn a_replay_arms_as_live_and_its_recorded_answers_find_the_arming() {
    // A replay's sessions (gpumon analyze: `Sessions::new` alone) arm as the daemon's default
    // policy does; the replay drops the request, and the recorded `armed` and `peak` answer it.
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (key, _) = s.open(&mut jobs, PEER, hello(&["oom_history"]), T0);
    let mut arm = None;
    for step in 1..=100 {
        let x = tight(step);
        let now = x.ts;
        s.sample(key, x, now);
        if let Some(ArmLine::Arm(a)) = s.arm_due(key, now) {
            arm = Some(a);
            break;
        }
    }
    let arm = arm.expect("armed as live");
    let answer = |id| ArmAnswer {
        id,
        ts: T0 + 10.0,
        error: None,
        detail: None,
    };
    // An answer to no arming is refused, as live.
    assert!(s.armed(key, answer(arm.id + 1)).is_err());
    s.armed(key, answer(arm.id)).unwrap();
    s.peak(key, attention(arm.id)).unwrap();
    let sess = s.live().next().unwrap();
    let f = sess.detect.firing(Kind::NearLimit).unwrap();
    assert_eq!(
        f.peak.as_ref().unwrap().finding.as_deref(),
        Some("s-1/near_limit")
    );
    assert!(f.message.contains("model.py:88 in attention"));
    // Closing ends any arming; nothing is left armed in the ended session.
    s.close(&mut jobs, key, Ending::Clean, T0 + 11.0);
    assert_eq!(s.armed_count(), 0);
}

#[test]
fn closing_the_session_ends_its_arming() {
    let mut r = Rig::capable();
    r.until_near_limit();
    assert_eq!(r.s.armed_count(), 1);
    r.s.close(&mut r.jobs, r.key, Ending::Crash, T0 + 100.0);
    assert_eq!(r.s.armed_count(), 0);
    assert!(r.s.ended().next().unwrap().arming.armed().is_none());
}
