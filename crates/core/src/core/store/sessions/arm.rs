//! Arming a trainer before an OOM (the `arm` request, docs/protocol.md): while one is likely,
//! the trainer keeps allocation history recording, so that the OOM, when it comes, has its
//! lines; for near_limit it also reports what is live at the step peak. Only clients that
//! announced `oom_history` are armed; never while armed, at most once per `rearm_seconds`,
//! never again once a trainer said it cannot; disarmed when the risk has passed, and over after
//! its `seconds` anyway (the trainer stops by itself then).
//!
//! A replay (`gpumon analyze`) runs these same rules: its core arms as the daemon did, drops
//! the requests, and the trace's recorded `armed` and `peak` lines answer them as they did live.

mod policy;

use serde::{Deserialize, Serialize};

use super::attribute::event;
use super::{Session, Sessions};
use crate::core::detect::peak::Peak;
use crate::core::detect::{Finding, FindingState};
use crate::core::model::Timestamp;

pub use policy::{OomPolicy, MAX_ENTRIES};

/// An `armed` or `peak` whose id answers no open arm request, nor (once each) the last one
/// that ended (the connection replies `bad_field`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} with id {id} answers no open arm request; send {what} only to answer an arm request, with its id (once)")]
pub struct UnaskedArm {
    pub what: &'static str,
    pub id: u64,
}

/// The trainer's `armed` answer: recording, or why not.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmAnswer {
    pub id: u64,
    pub ts: Timestamp,
    /// `unavailable` (never asked again), `failed` (may be asked again later).
    pub error: Option<String>,
    pub detail: Option<String>,
}

/// Why a session was armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArmReason {
    /// Its near_limit finding went firing.
    NearLimit,
    /// Its leak's OOM forecast came within `oom.arm_eta_seconds`.
    LeakForecast,
    /// A reason this build does not know (a newer daemon's).
    #[serde(other)]
    Unknown,
}

impl ArmReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ArmReason::NearLimit => "near_limit",
            ArmReason::LeakForecast => "leak_forecast",
            ArmReason::Unknown => "unknown",
        }
    }
}

/// A session's arming while it lasts: the session's `armed` in the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Armed {
    /// The `arm` request's id (the connection's request counter, shared with `attribute`).
    pub id: u64,
    /// The finding that armed it.
    pub finding: String,
    pub reason: ArmReason,
    /// When the request went out, and when the arming ends at the latest (`since + seconds`).
    pub since: Timestamp,
    pub until: Timestamp,
    /// The trainer answered `armed`: it is recording (false until it answers).
    pub recording: bool,
    /// Steps after which the trainer reports the step peak; 0: not asked.
    pub peak_after_steps: u64,
}

/// An `arm` request to send, as the protocol names its fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmRequest {
    pub id: u64,
    pub finding: String,
    pub seconds: f64,
    pub max_entries: u64,
    pub peak_after_steps: u64,
}

/// A line of the arming cycle due to the trainer.
#[derive(Debug, Clone, PartialEq)]
pub enum ArmLine {
    Arm(ArmRequest),
    Disarm { id: u64 },
}

/// One session's side.
#[derive(Debug, Clone, Default)]
pub struct Arming {
    /// The hello listed `oom_history`.
    capable: bool,
    /// The trainer answered `unavailable`: it is not armed again.
    unavailable: bool,
    open: Option<Armed>,
    /// A `peak` is still expected for the open arming.
    peak_open: bool,
    last_arm: Option<Timestamp>,
    /// The last arming that ended (disarm, time cap, the trainer's error): its `armed` and
    /// `peak` may still be in flight (a peak comes some 20 steps after the request), and one
    /// late answer of each is taken.
    closed: Option<Closed>,
}

/// An ended arming whose answers may still come.
#[derive(Debug, Clone, Default)]
struct Closed {
    id: u64,
    finding: String,
    /// No `armed` answer came while it was open.
    armed_due: bool,
    /// It asked for a peak and none came while it was open.
    peak_due: bool,
}

impl Arming {
    pub fn new(capable: bool) -> Self {
        Self {
            capable,
            ..Self::default()
        }
    }

    /// The arming in force, if any.
    pub fn armed(&self) -> Option<&Armed> {
        self.open.as_ref()
    }
}

/// What puts a session at risk now: its near_limit finding (pending or firing), and the
/// finding to arm for with its reason, if one should arm.
struct Risk<'a> {
    near_limit: Option<&'a Finding>,
    leak_soon: Option<&'a Finding>,
}

impl<'a> Risk<'a> {
    fn of(sess: &'a Session, p: &OomPolicy) -> Self {
        Self {
            near_limit: sess.detect.near_limit(),
            leak_soon: sess.detect.leak().filter(|f| {
                f.evidence
                    .oom_eta_seconds
                    .is_some_and(|eta| eta <= p.arm_eta_seconds)
            }),
        }
    }

    /// Still at risk: near_limit not resolved, or the leak's OOM still forecast soon.
    fn present(&self) -> bool {
        self.near_limit.is_some() || self.leak_soon.is_some()
    }

    /// The finding to arm for: near_limit once it fires (with a peak), else a leak due soon.
    fn trigger(&self) -> Option<(&'a Finding, ArmReason)> {
        self.near_limit
            .filter(|f| f.state == FindingState::Firing)
            .map(|f| (f, ArmReason::NearLimit))
            .or(self.leak_soon.map(|f| (f, ArmReason::LeakForecast)))
    }
}

impl Sessions {
    /// The `[oom]` settings (the defaults until set).
    pub fn with_arming(mut self, policy: OomPolicy) -> Self {
        self.arming = policy;
        self
    }

    /// The arm or disarm line session `key` should send now, if one is due. Also ends an
    /// arming past its time cap (the trainer stops by itself then: nothing is sent).
    pub fn arm_due(&mut self, key: u64, now: Timestamp) -> Option<ArmLine> {
        let policy = self.arming;
        let sess = self.live.get_mut(&key)?;
        if !sess.arming.capable {
            return None;
        }
        let capped = sess
            .arming
            .open
            .as_ref()
            .filter(|a| now >= a.until)
            .map(|a| {
                format!(
                    "time cap: arm request {} for {} ended after {:.0} s",
                    a.id,
                    a.finding,
                    a.until - a.since
                )
            });
        if let Some(detail) = capped {
            sess.arming.end();
            event(sess, now, "disarmed", detail);
        }
        let at_risk = Risk::of(sess, &policy).present();
        if let Some(a) = sess.arming.open.as_ref() {
            if at_risk {
                return None;
            }
            let id = a.id;
            let detail = format!(
                "the risk has passed: arm request {id} for {} ended",
                a.finding
            );
            sess.arming.end();
            event(sess, now, "disarmed", detail);
            return Some(ArmLine::Disarm { id });
        }
        let a = &sess.arming;
        let cooling = a.last_arm.is_some_and(|t| now - t < policy.rearm_seconds);
        if !policy.arm || a.unavailable || cooling || !at_risk {
            return None;
        }
        let (finding, reason) = Risk::of(sess, &policy)
            .trigger()
            .map(|(f, r)| (f.id.clone(), r))?;
        let peak_after_steps = match reason {
            ArmReason::NearLimit => policy.peak_after_steps,
            ArmReason::LeakForecast | ArmReason::Unknown => 0,
        };
        let id = sess.asking.next_id();
        let detail = format!(
            "asked to record allocation history for up to {} s for {finding} ({}, request {id})",
            policy.arm_seconds,
            reason.as_str()
        );
        sess.arming.last_arm = Some(now);
        sess.arming.peak_open = peak_after_steps > 0;
        sess.arming.open = Some(Armed {
            id,
            finding: finding.clone(),
            reason,
            since: now,
            until: now + policy.arm_seconds,
            recording: false,
            peak_after_steps,
        });
        event(sess, now, "arm_requested", detail);
        Some(ArmLine::Arm(ArmRequest {
            id,
            finding,
            seconds: policy.arm_seconds,
            max_entries: policy.max_entries,
            peak_after_steps,
        }))
    }

    /// The trainer's `armed` answer. It must answer the open arming, once; an error ends the
    /// arming (and `unavailable` any later one).
    pub fn armed(&mut self, key: u64, a: ArmAnswer) -> Result<(), UnaskedArm> {
        let Some(sess) = self.live.get_mut(&key) else {
            return Ok(());
        };
        let unasked = UnaskedArm {
            what: "armed",
            id: a.id,
        };
        let mut late = false;
        match (sess.arming.open.as_mut(), sess.arming.closed.as_mut()) {
            (Some(open), _) if open.id == a.id && !open.recording => {
                open.recording = a.error.is_none();
            }
            // The arming ended while this answer was on its way: taken once, as an event.
            (_, Some(c)) if c.id == a.id && c.armed_due => {
                c.armed_due = false;
                late = true;
            }
            _ => return Err(unasked),
        }
        match a.error.as_deref() {
            Some(error) => {
                if !late {
                    sess.arming.end();
                    // This was its answer: a second is not late but twice.
                    if let Some(c) = sess.arming.closed.as_mut() {
                        c.armed_due = false;
                    }
                }
                sess.arming.unavailable |= error == "unavailable";
                let detail = format!("{error}: {}", a.detail.as_deref().unwrap_or(""));
                event(sess, a.ts, "arm_failed", detail);
            }
            None if late => event(
                sess,
                a.ts,
                "armed",
                format!("recording (request {}, answered after it ended)", a.id),
            ),
            None => event(sess, a.ts, "armed", format!("recording (request {})", a.id)),
        }
        Ok(())
    }

    /// A `peak` from session `key`'s trainer. It must answer the open arming that asked for
    /// one, once; it goes on the near_limit finding the arming was for while that is pending
    /// or firing.
    pub fn peak(&mut self, key: u64, mut p: Peak) -> Result<(), UnaskedArm> {
        let Some(sess) = self.live.get_mut(&key) else {
            return Ok(());
        };
        let finding = match (sess.arming.open.as_ref(), sess.arming.closed.as_mut()) {
            (Some(a), _) if a.id == p.id && sess.arming.peak_open => {
                sess.arming.peak_open = false;
                Some(a.finding.clone())
            }
            // The arming ended (disarm, time cap) while its peak was on its way: taken once;
            // it goes on the finding if that is still pending or firing, else is an event.
            (_, Some(c)) if c.id == p.id && c.peak_due => {
                c.peak_due = false;
                Some(c.finding.clone())
            }
            _ => {
                return Err(UnaskedArm {
                    what: "peak",
                    id: p.id,
                })
            }
        };
        p.finding = finding.clone();
        match p.error.as_deref() {
            Some(error) => {
                let detail = format!("{error}: {}", p.detail.as_deref().unwrap_or(""));
                event(sess, p.ts, "peak_failed", detail);
            }
            None => {
                sess.detect.peak(finding.as_deref(), &p, &mut self.findings);
                event(sess, p.ts, "peak", summary(&p));
            }
        }
        Ok(())
    }

    /// Live sessions armed now (`gpumon_oom_armed_sessions`).
    pub fn armed_count(&self) -> usize {
        self.live
            .values()
            .filter(|s| s.arming.open.is_some())
            .count()
    }
}

impl Arming {
    fn end(&mut self) {
        if let Some(a) = self.open.take() {
            self.closed = Some(Closed {
                id: a.id,
                finding: a.finding,
                armed_due: !a.recording,
                peak_due: self.peak_open,
            });
        }
        self.peak_open = false;
    }
}

impl Session {
    /// The session ends: so does its arming (the trainer stops recording with its connection).
    pub(super) fn end_arming(&mut self) {
        self.arming.end();
    }
}

/// "52% at model.py:88 in attention of a 4.0 GiB peak": the top site, as a session event says it.
fn summary(p: &Peak) -> String {
    let peak = crate::units::bytes(p.peak_bytes);
    match p.top() {
        Some(top) => format!(
            "{:.0}% of the {peak} step peak at {} in {}",
            p.share(top) * 100.0,
            top.short(),
            top.function
        ),
        None => format!("{peak} step peak; no allocation site in the trainer's code"),
    }
}

// Its tests check the reply a trainer gets (ingest's protocol), so they live in the gpumon crate
// (src/core/tests/arm.rs).
