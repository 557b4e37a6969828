//! The detectors of one trainer session and the findings they hold. Fed by the session store as
//! lines arrive (live) or by `gpumon analyze` (offline): same calls, same verdicts.

use super::attribution::Attribution;
use super::explanation::Explanation;
use super::findings::{
    ConsequenceOf, Finding, FindingState, Findings, Severity, Subject, Transition,
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
    /// Why the current finding names no line, when its trainer answered that it could not say
    /// (an `attribution` error): a clause of its message through every refresh.
    no_line: Option<String>,
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
    /// The signal the trainer said it received (for `Ending::Stopped`).
    pub signal: Option<&'a str>,
    /// The exception the trainer said it died of (named on its crash).
    pub exception: Option<&'a str>,
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
            no_line: None,
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
                        f.transition(Transition::ConsequenceOf { of, at: now });
                    }
                    findings.hold_cause(f, now);
                    continue;
                }
                f.transition(Transition::Resolve { at: now, why: None });
                findings.resolved(f);
            }
        }
        let kind = match end.ending {
            Ending::Clean => return,
            Ending::Crash => Kind::Crash,
            Ending::Stopped => Kind::Stopped,
        };
        let mut evidence = crash::evidence(end.last);
        match kind {
            Kind::Stopped => evidence.signal = end.signal.map(str::to_string),
            _ => evidence.exception = end.exception.map(str::to_string),
        }
        // A crash after its own OOM follows that OOM: the oom finding is the one that pages.
        let own_oom = end.died_of_oom.then(|| ConsequenceOf {
            session: who.session.clone(),
            rank: who.rank,
            kind: Kind::Oom,
            host: None,
        });
        let of = end.consequence_of.as_ref().or(own_oom.as_ref());
        let mut f = Finding {
            id: ending_id(&who.session, Some(end.ending)),
            kind,
            state: FindingState::Firing,
            // A stop is an end someone chose: it never pages.
            severity: match kind {
                Kind::Crash => Severity::Critical,
                _ => Severity::Warning,
            },
            subject: who.clone(),
            gpu: None,
            first_step: evidence.step,
            first_ts: now,
            since: Some(now),
            updated_ts: now,
            resolved_ts: None,
            message: message::describe(kind, &evidence),
            hint: message::hint(kind, &evidence),
            evidence,
            attribution: None,
            peak: None,
            consequence_of: None,
        };
        if let Some(of) = of {
            f.transition(Transition::ConsequenceOf { of, at: now });
        }
        findings.hold(f);
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
        f.message = describe(f, None);
        f.updated_ts = f.updated_ts.max(a.ts);
        findings.updated(f);
        Some(f.id.clone())
    }

    /// A trainer's answer that it could not attribute (`error` set): the leak finding (the one
    /// named `id`, when given) keeps no attribution, but its message says why it names no line,
    /// in every output, until it resolves. Returns the id of the finding it went on.
    pub fn unattributed(
        &mut self,
        id: Option<&str>,
        a: &Attribution,
        findings: &mut Findings,
    ) -> Option<String> {
        self.no_line(id, message::unattributed(a)?, a.ts, findings)
    }

    /// Why the leak finding (the one named `id`, when given) names no line, when no trainer's
    /// answer says it (the trainer cannot be asked): `clause`, on its message from `ts` until it
    /// resolves. Nothing changes, and the sinks hear nothing, when it says so already or has
    /// its line. Returns the id of the finding it went on.
    pub fn no_line(
        &mut self,
        id: Option<&str>,
        clause: String,
        ts: Timestamp,
        findings: &mut Findings,
    ) -> Option<String> {
        let t = self.tracks.iter_mut().find(|t| {
            t.current.as_ref().is_some_and(|f| {
                f.kind == Kind::Leak && f.attribution.is_none() && id.is_none_or(|id| f.id == id)
            })
        })?;
        if t.no_line.as_deref() == Some(clause.as_str()) {
            return None;
        }
        t.no_line = Some(clause);
        let f = t.current.as_mut()?;
        f.message = describe(f, t.no_line.as_deref());
        f.updated_ts = f.updated_ts.max(ts);
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
        f.message = describe(f, None);
        f.updated_ts = f.updated_ts.max(p.ts);
        findings.updated(f);
        Some(f.id.clone())
    }
}

/// The id of a session's crash finding.
pub fn crash_id(session: &str) -> String {
    format!("{session}/crash")
}

/// The id of the finding a session's ending raised: `/stopped` for a stop, else `/crash`.
pub fn ending_id(session: &str, ending: Option<Ending>) -> String {
    match ending {
        Some(Ending::Stopped) => format!("{session}/stopped"),
        _ => crash_id(session),
    }
}

/// The finding's message: with an attribution, followed by where the growth was allocated (or
/// why no line is named); with a step peak, by what held the memory then.
fn describe(f: &Finding, no_line: Option<&str>) -> String {
    let mut m = message::describe(f.kind, &f.evidence);
    let why = f
        .attribution
        .as_ref()
        .filter(|a| message::attributed(a).is_none())
        .and_then(message::unattributed)
        .or_else(|| {
            no_line
                .map(String::from)
                .filter(|_| f.attribution.is_none())
        });
    if let Some(why) = why {
        // Before the forecast: a cut message keeps its last clause, and the time left matters
        // more than why no line is named.
        let forecast = message::forecast(&f.evidence);
        let at = if m.ends_with(&forecast) {
            m.len() - forecast.len()
        } else {
            m.len()
        };
        m.insert_str(at, &format!("; {why}"));
    }
    let clauses = [
        // A leak the trainer answered for names its line (its last clause, kept by any cut).
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
        Change::Dropped => {
            t.current = None;
            t.no_line = None;
        }
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
            f.message = describe(f, t.no_line.as_deref());
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
            t.no_line = None;
            if let Some(mut f) = t.current.take() {
                f.transition(Transition::Resolve { at: ts, why: None });
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
        Kind::Stopped
        | Kind::Leak
        | Kind::NearLimit
        | Kind::Fragmentation
        | Kind::UntrackedGrowth
        | Kind::OrphanedMemory
        | Kind::CacheGrowth
        | Kind::Unknown => Severity::Warning,
    }
}
