//! The detectors of one trainer session and the findings they hold. Fed by the session store as
//! lines arrive (live) or by `gpumon analyze` (offline): same calls, same verdicts.

use super::attribution::Attribution;
use super::explanation::Explanation;
use super::findings::{
    consequence_message, ConsequenceOf, Finding, FindingState, Findings, Severity, Subject,
};
use super::lifecycle::{Change, Lifecycle, Span};
use super::peak::Peak;
use super::window::StepAxis;
use super::{
    crash, fragmentation, leak, message, near_limit, oom, DetectConfig, Detector, Evidence, Kind,
    Obs, Pos, Signal,
};
use crate::core::model::Timestamp;
use crate::core::trainer::Sample;
use crate::core::trainer::{Ending, EventRecord};

struct Track {
    det: Box<dyn Detector>,
    life: Lifecycle,
    current: Option<Finding>,
    /// Times this kind fired in this session, for distinct ids when it fires again.
    raised: u32,
}

/// How a session ended, for `SessionDetect::close`.
#[derive(Debug, Clone)]
pub struct End<'a> {
    pub ending: Ending,
    pub last: Option<&'a Sample>,
    pub now: Timestamp,
    /// It ended by an OOM it did not go on from.
    pub died_of_oom: bool,
    /// Its failure followed another rank's within the cascade window.
    pub consequence_of: Option<ConsequenceOf>,
}

pub struct SessionDetect {
    tracks: Vec<Track>,
    /// Steps as detectors and findings see them: continued across a step count that starts over.
    steps: StepAxis,
}

/// near_limit resolves only after this long without pressure (no retries in the detector's
/// window, room at the peak): retries come in bursts, and each gap between bursts must not
/// resolve it and raise it again.
const NEAR_LIMIT_QUIET: Span = Span {
    samples: 3,
    steps: 100,
    secs: 120.0,
};
/// Fragmentation must persist, and be gone, for this long: a while in steps and in time.
const FRAGMENTATION_HOLDS: Span = Span {
    samples: 5,
    steps: 50,
    secs: 30.0,
};

impl SessionDetect {
    pub fn new(cfg: &DetectConfig) -> Self {
        let track = |det: Box<dyn Detector>, raise, clear| Track {
            det,
            life: Lifecycle::new(raise, clear),
            current: None,
            raised: 0,
        };
        Self {
            tracks: vec![
                // The leak detector confirms on its own (a rising window seen twice); its
                // observations are evaluations of whole segments, not samples.
                // It forgets the leak's onset after as many quiet evaluations as resolve the
                // finding: keep the two together.
                track(
                    Box::new(leak::Leak::new(cfg.leak_materiality_ratio)),
                    Span::samples(1),
                    Span::samples(leak::QUIET_EVALUATIONS),
                ),
                track(
                    Box::new(near_limit::NearLimit::new(cfg.headroom_margin_bytes)),
                    Span::samples(2),
                    NEAR_LIMIT_QUIET,
                ),
                track(
                    Box::<fragmentation::Fragmentation>::default(),
                    FRAGMENTATION_HOLDS,
                    FRAGMENTATION_HOLDS,
                ),
                // Growth outside the allocator: the leak's test on another floor, and its
                // lifecycle.
                track(
                    Box::new(leak::Leak::outside(cfg.leak_materiality_ratio)),
                    Span::samples(1),
                    Span::samples(leak::QUIET_EVALUATIONS),
                ),
                // A cache that keeps growing while allocated is flat: the leak's test on the
                // reserved floor, and its lifecycle.
                track(
                    Box::new(leak::Leak::cache(cfg.leak_materiality_ratio)),
                    Span::samples(1),
                    Span::samples(leak::QUIET_EVALUATIONS),
                ),
                // The OOM detector holds its own signal for a while after the last OOM.
                track(
                    Box::<oom::Oom>::default(),
                    Span::samples(1),
                    Span::samples(1),
                ),
            ],
            steps: StepAxis::default(),
        }
    }

    pub fn sample(&mut self, who: &Subject, obs: &Obs, findings: &mut Findings) {
        let step = self.steps.at(obs.sample.step);
        if !self.steps.shifted() {
            return self.observe(who, obs, step, findings);
        }
        // After a reset the detectors see the continued step; the copy is needed only then.
        let sample = Sample {
            step,
            ..obs.sample.clone()
        };
        let shifted = Obs {
            sample: &sample,
            ..*obs
        };
        self.observe(who, &shifted, step, findings);
    }

    fn observe(&mut self, who: &Subject, obs: &Obs, step: Option<u64>, findings: &mut Findings) {
        for t in &mut self.tracks {
            if let Some(sig) = t.det.sample(obs) {
                apply(t, who, sig, step, obs.ts(), findings);
            }
        }
    }

    pub fn event(
        &mut self,
        who: &Subject,
        e: &EventRecord,
        explanation: Option<&Explanation>,
        findings: &mut Findings,
    ) {
        for t in &mut self.tracks {
            if let Some(sig) = t.det.event(e, explanation) {
                let step = sig.evidence.step;
                apply(t, who, sig, step, e.ts, findings);
            }
        }
    }

    /// The session ended: its findings resolve; a crash raises one of its own. A session that
    /// died of an OOM keeps its `oom` finding firing (held like a crash: it is the cause); a
    /// failure that followed another rank's is a warning naming it (`consequence_of`).
    pub fn close(&mut self, who: &Subject, end: &End, findings: &mut Findings) {
        let now = end.now;
        for t in &mut self.tracks {
            if let Some(mut f) = t.current.take() {
                if f.state != FindingState::Firing {
                    continue;
                }
                if f.kind == Kind::Oom && end.died_of_oom {
                    if let Some(of) = &end.consequence_of {
                        f.severity = Severity::Warning;
                        f.message = consequence_message(&f.message, of);
                        f.consequence_of = Some(of.clone());
                    }
                    findings.hold_cause(f, now);
                    continue;
                }
                f.state = FindingState::Resolved;
                f.resolved_ts = Some(now);
                f.updated_ts = now;
                findings.resolved(f);
            }
        }
        if end.ending == Ending::Crash {
            let evidence = crash::evidence(end.last);
            // A crash after its own OOM follows that OOM: the oom finding is the one that pages.
            let own_oom = end.died_of_oom.then(|| ConsequenceOf {
                session: who.session.clone(),
                rank: who.rank,
                kind: Kind::Oom,
                host: None,
            });
            let of = end.consequence_of.clone().or(own_oom);
            let mut message = message::describe(Kind::Crash, &evidence);
            if let Some(of) = &of {
                message = if of.session == who.session {
                    format!("{message}; after its own oom")
                } else {
                    consequence_message(&message, of)
                };
            }
            findings.hold(Finding {
                id: crash_id(&who.session),
                kind: Kind::Crash,
                state: FindingState::Firing,
                severity: match of {
                    Some(_) => Severity::Warning,
                    None => Severity::Critical,
                },
                subject: who.clone(),
                gpu: None,
                first_step: evidence.step,
                first_ts: now,
                since: Some(now),
                updated_ts: now,
                resolved_ts: None,
                message,
                hint: message::hint(Kind::Crash, &evidence),
                evidence,
                attribution: None,
                peak: None,
                consequence_of: of,
            });
        }
    }

    /// Pending and firing findings of this session.
    pub fn current(&self) -> impl Iterator<Item = &Finding> {
        self.tracks.iter().filter_map(|t| t.current.as_ref())
    }

    pub fn firing(&self, kind: Kind) -> Option<&Finding> {
        self.current()
            .find(|f| f.kind == kind && f.state == FindingState::Firing)
    }

    /// The leak finding, pending or firing.
    pub fn leak(&self) -> Option<&Finding> {
        self.current().find(|f| f.kind == Kind::Leak)
    }

    /// Puts a trainer's attribution on the leak finding (the one named `id`, when given) while
    /// it is pending or firing; its message names the top site from now on, through every
    /// refresh and into its resolved record, and the sinks get the change. Returns the id of
    /// the finding it went on.
    pub fn attribute(
        &mut self,
        id: Option<&str>,
        a: &Attribution,
        findings: &mut Findings,
    ) -> Option<String> {
        let f = self
            .tracks
            .iter_mut()
            .filter_map(|t| t.current.as_mut())
            .find(|f| f.kind == Kind::Leak && id.is_none_or(|id| f.id == id))?;
        f.attribution = Some(a.clone());
        f.message = describe(f);
        f.updated_ts = f.updated_ts.max(a.ts);
        findings.updated(f);
        Some(f.id.clone())
    }

    /// The near_limit finding, pending or firing.
    pub fn near_limit(&self) -> Option<&Finding> {
        self.current().find(|f| f.kind == Kind::NearLimit)
    }

    /// Puts what was live at the step peak on the near_limit finding (the one named `id`, when
    /// given) while it is pending or firing, as `attribute` does for a leak. Returns the id of
    /// the finding it went on.
    pub fn peak(&mut self, id: Option<&str>, p: &Peak, findings: &mut Findings) -> Option<String> {
        let f = self
            .tracks
            .iter_mut()
            .filter_map(|t| t.current.as_mut())
            .find(|f| f.kind == Kind::NearLimit && id.is_none_or(|id| f.id == id))?;
        f.peak = Some(p.clone());
        f.message = describe(f);
        f.updated_ts = f.updated_ts.max(p.ts);
        findings.updated(f);
        Some(f.id.clone())
    }
}

/// The id of a session's crash finding.
pub fn crash_id(session: &str) -> String {
    format!("{session}/crash")
}

/// The finding's message: with an attribution, followed by where the growth was allocated;
/// with a step peak, by what held the memory then.
fn describe(f: &Finding) -> String {
    let mut m = message::describe(f.kind, &f.evidence);
    let clauses = [
        f.attribution.as_ref().and_then(message::attributed),
        f.peak.as_ref().and_then(message::at_peak),
    ];
    for clause in clauses.into_iter().flatten() {
        m.push_str("; ");
        m.push_str(&clause);
    }
    m
}

fn apply(
    t: &mut Track,
    who: &Subject,
    sig: Signal,
    step: Option<u64>,
    ts: Timestamp,
    findings: &mut Findings,
) {
    let kind = t.det.kind();
    match t.life.step(sig.active, Pos { step, ts }) {
        Change::Quiet => {}
        Change::Dropped => t.current = None,
        Change::Pending | Change::Fired | Change::Firing => {
            if !sig.active {
                // Firing but not seen this time: keep the last evidence until it resolves.
                return;
            }
            let firing = t.life.is_firing();
            let f = t.current.get_or_insert_with(|| {
                t.raised += 1;
                Finding {
                    id: if t.raised == 1 {
                        format!("{}/{}", who.session, kind.as_str())
                    } else {
                        format!("{}/{}#{}", who.session, kind.as_str(), t.raised)
                    },
                    kind,
                    state: FindingState::Pending,
                    severity: severity(kind, &sig.evidence),
                    subject: who.clone(),
                    gpu: None,
                    first_step: step,
                    first_ts: ts,
                    since: None,
                    updated_ts: ts,
                    resolved_ts: None,
                    message: String::new(),
                    hint: None,
                    evidence: Default::default(),
                    attribution: None,
                    peak: None,
                    consequence_of: None,
                }
            });
            f.hint = message::hint(kind, &sig.evidence);
            let was = f.severity;
            f.severity = severity(kind, &sig.evidence);
            f.evidence = sig.evidence;
            f.message = describe(f);
            f.updated_ts = ts;
            if f.state == FindingState::Firing && f.severity != was {
                // An OOM the trainer went on from is no failure to page for (and a new one is
                // again): the sinks hear of the change.
                findings.updated(f);
            }
            if firing && f.state != FindingState::Firing {
                f.state = FindingState::Firing;
                f.since = Some(ts);
                // Offline analysis reports the step at which a finding was raised.
                f.first_step = step.or(f.first_step);
                f.first_ts = ts;
                findings.fired(f);
            }
        }
        Change::Resolved => {
            if let Some(mut f) = t.current.take() {
                f.state = FindingState::Resolved;
                f.resolved_ts = Some(ts);
                f.updated_ts = ts;
                findings.resolved(f);
            }
        }
    }
}

/// An OOM is critical until samples show the trainer caught it and went on (batch-size
/// search runs out of memory on purpose); a crash always is.
fn severity(kind: Kind, e: &Evidence) -> Severity {
    match kind {
        Kind::Oom if e.survived == Some(true) => Severity::Warning,
        Kind::Oom | Kind::Crash => Severity::Critical,
        Kind::Leak
        | Kind::NearLimit
        | Kind::Fragmentation
        | Kind::UntrackedGrowth
        | Kind::OrphanedMemory
        | Kind::CacheGrowth
        | Kind::Unknown => Severity::Warning,
    }
}
