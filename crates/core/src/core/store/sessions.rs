//! Trainer sessions: what each instrumented trainer has pushed, bounded per session and in
//! count. A session lives from `hello` until its connection ends; ended sessions are kept a
//! short while (for the API and the crash record) and then dropped.

mod arm;
mod attribute;
mod close;
pub mod nvml;
pub mod ooms;
mod orphans;

use crate::core::categories::Tracker;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::session_series::SessionSeries;
use crate::core::detect::attribution::Attribution;
use crate::core::detect::findings::log_limit::LogLimit;
use crate::core::detect::findings::Subject;
use crate::core::detect::session::ending_id;
use crate::core::detect::{DetectConfig, Findings, Obs, SessionDetect};
use crate::core::jobs::Jobs;
use crate::core::model::Timestamp;
use crate::core::trainer::{
    Ending, Event, EventKind, EventRecord, Exit, Hello, Peer, Sample, SessionPoint, Stats,
    CAP_ATTRIBUTION, CAP_OOM_HISTORY,
};
use crate::util::bounded::Bounded;

pub use arm::{
    ArmAnswer, ArmLine, ArmReason, ArmRequest, Armed, Arming, OomPolicy, UnaskedArm,
    MAX_ENTRIES as OOM_MAX_ENTRIES,
};
pub use attribute::{steps_for, Asking, AttributionPolicy, Request, Unasked};

/// A cumulative allocator counter that survives the trainer resetting its stats: a decrease is a
/// reset, and counting resumes from the new value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    pub total: u64,
    last_raw: Option<u64>,
}

impl Counter {
    pub fn observe(&mut self, raw: Option<u64>) {
        let Some(raw) = raw else { return };
        let delta = match self.last_raw {
            Some(last) if raw >= last => raw - last,
            // First sight or reset: what the trainer reports now has all happened.
            _ => raw,
        };
        self.total = self.total.saturating_add(delta);
        self.last_raw = Some(raw);
    }
}

/// A session's OOMs: the allocator's `num_ooms`, or the `oom` events seen when those are more.
/// A trainer usually dies right after an OOM, before any sample could carry the counter; a later
/// sample's counter includes the OOM its event announced, so the two are not added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomCount {
    pub total: u64,
    counter: Counter,
    events: u64,
}

impl OomCount {
    fn observe(&mut self, raw: Option<u64>) {
        self.counter.observe(raw);
        self.total = self.counter.total.max(self.events);
    }

    fn event(&mut self) {
        self.events += 1;
        self.total = self.counter.total.max(self.events);
    }
}

pub struct Session {
    pub id: String,
    pub peer: Peer,
    pub hello: Hello,
    pub started: Timestamp,
    pub last_sample: Option<(Timestamp, Sample)>,
    pub last_arrival: Option<Timestamp>,
    /// The time of the session's latest sample or event, as taken: a later event is dated no
    /// earlier, so no rank can backdate an OOM to take over as its job's cause after the fact.
    pub latest_ts: Option<Timestamp>,
    pub samples: u64,
    pub retries: Counter,
    pub ooms: OomCount,
    /// Its `oom` events, newest first, bounded (the API's `ooms` and `ooms_omitted`).
    pub oom_log: ooms::Ooms,
    /// `ooms.total` at the latest sample: every OOM before a sample was survived (the sample
    /// that shows a rise in the counter was itself taken after the OOM).
    pub ooms_survived: u64,
    /// The caching allocator's cap, as last reported (hello, then any sample or event that
    /// carries `alloc_limit`); None when the trainer never said.
    pub alloc_limit: Option<u64>,
    pub series: SessionSeries,
    pub events: Bounded<EventRecord>,
    pub ended: Option<(Timestamp, Ending)>,
    /// Who this session is, as findings name it.
    pub subject: Subject,
    pub detect: SessionDetect,
    /// The latest `attribution` the trainer sent (sites, or why it could not).
    pub attribution: Option<Attribution>,
    /// Whether and for what the trainer is being asked for an attribution.
    pub asking: Asking,
    /// Whether and for what the trainer is armed to record allocation history.
    pub arming: Arming,
    /// NVML's figure for its process on its GPU from the latest poll, when it is its alone.
    pub nvml: Option<nvml::NvmlFigure>,
    /// The job it is a rank of (`Jobs`); None without a job name or past the jobs' bounds.
    pub job: Option<u64>,
    /// Where its memory goes: the splits it measured (categories.rs).
    pub categories: Tracker,
    /// The latest signal the trainer said it received, when (its clock) and which.
    pub signal: Option<(Timestamp, String)>,
    /// The uncaught exception the trainer said it is dying of (the first it said).
    pub exception: Option<String>,
}

impl Session {
    /// The batch that fits its latest split, against its latest sample's limit (what
    /// `near_limit` judges headroom by): the API's `batch_fit` and the metrics' figure.
    pub fn batch_fit(&self) -> Option<crate::core::categories::BatchFit> {
        let (_, last) = self.last_sample.as_ref()?;
        self.categories.latest()?;
        let obs = Obs {
            alloc_limit: self.alloc_limit,
            ..Obs::of(last)
        };
        self.categories.fit(obs.budget())
    }
}

/// Limits that keep the session store bounded whatever clients send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    pub points: usize,
    pub events: usize,
    /// Ended sessions kept for the API; the oldest go first.
    pub ended_kept: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            points: 3600,
            events: 64,
            ended_kept: 64,
        }
    }
}

/// `n` in lower-case base 36: short ids (the daemon's start in session ids, the TUI's cursor).
pub(crate) fn base36(mut n: u64) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

pub struct Sessions {
    limits: SessionLimits,
    next_id: u64,
    /// Between `s-` and the number in session ids: the daemon's start time, so ids (and the
    /// `session` label) are not reused for other trainers after a restart.
    id_prefix: String,
    /// By numeric id, so iteration is in start order.
    live: BTreeMap<u64, Session>,
    ended: Bounded<Session>,
    detect: DetectConfig,
    /// How sessions ask for attributions (`[attribution]`; a replay: the defaults).
    policy: AttributionPolicy,
    /// How sessions are armed before an OOM (`[oom]`; a replay: the defaults).
    arming: OomPolicy,
    pub findings: Findings,
    /// Samples whose `ts` was outside the sane window around their arrival and were taken at
    /// their arrival time instead (`sample`), since start.
    pub timestamps_clamped: u64,
    /// OOMs of every session since start, by pattern, and those the trainer went on from.
    pub oom_counts: ooms::OomCounts,
    /// The latest NVML reading (shared with the store), so a session's GPU is resolved when it
    /// opens; None in a replay.
    pub devices: Option<std::sync::Arc<crate::core::model::NodeReading>>,
    /// A log line per session opened and closed, within a budget; None in a replay.
    log: Option<LogLimit>,
}

impl Sessions {
    pub fn new(limits: SessionLimits) -> Self {
        Self {
            limits,
            next_id: 1,
            id_prefix: String::new(),
            live: BTreeMap::new(),
            ended: Bounded::new(limits.ended_kept),
            detect: DetectConfig::default(),
            policy: AttributionPolicy::default(),
            arming: OomPolicy::default(),
            findings: Findings::default(),
            timestamps_clamped: 0,
            oom_counts: ooms::OomCounts::default(),
            devices: None,
            log: None,
        }
    }

    /// Logs a line per session opened and closed (the daemon's sessions; not a replay's).
    pub fn with_log(mut self) -> Self {
        self.log = Some(LogLimit::new("trainer session"));
        self
    }

    /// Session log lines left out over the budget, since start.
    pub fn log_suppressed(&self) -> u64 {
        self.log.as_ref().map_or(0, LogLimit::suppressed)
    }

    /// Session ids become `s-<started>-<n>`, `<started>` the Unix millisecond `started` in base
    /// 36 (`s-mi8dfxmo-17`): unique across restarts, however fast a supervisor restarts the daemon
    /// (seconds were not: a restart within the same second reused ids).
    pub fn with_id_epoch(mut self, started: Timestamp) -> Self {
        let millis = (started.max(0.0) * 1000.0).round() as u64;
        self.id_prefix = format!("{}-", base36(millis));
        self
    }

    pub fn with_detect(mut self, cfg: DetectConfig) -> Self {
        self.detect = cfg;
        self
    }

    /// The detection config the sessions judge by (which also sets their jobs' rules:
    /// `Store::set_sessions`).
    pub fn detect_config(&self) -> &DetectConfig {
        &self.detect
    }

    /// Seconds a failure stays firing (and in the job's failure metric) after its session.
    pub fn crash_hold_seconds(&self) -> f64 {
        self.detect.crash_hold_seconds
    }

    /// Opens a session, a rank of its job in `jobs`, under the next id of this store's own
    /// numbering (`s-<started>-17`), and returns its key and id.
    pub fn open(
        &mut self,
        jobs: &mut Jobs,
        peer: Peer,
        hello: Hello,
        now: Timestamp,
    ) -> (u64, String) {
        let id = format!("s-{}{}", self.id_prefix, self.next_id);
        self.open_as(jobs, id, peer, hello, now)
    }

    /// Opens a session named `id` (the ingest's from `open`; a replay's, the id its daemon gave,
    /// from the trace: unique in this store, which the caller sees to), a rank of its job in
    /// `jobs`, and returns its key and id. A trainer that comes back (same user, job and rank as
    /// a session that crashed) resolves that crash.
    pub fn open_as(
        &mut self,
        jobs: &mut Jobs,
        id: String,
        peer: Peer,
        hello: Hello,
        now: Timestamp,
    ) -> (u64, String) {
        let key = self.next_id;
        self.next_id += 1;
        if self.log.as_mut().is_some_and(|l| l.allow(now)) {
            tracing::info!(
                session = %id,
                job = hello.job.as_deref().unwrap_or("-"),
                rank = ?hello.rank,
                pid = peer.pid,
                uid = peer.uid,
                gpu_uuid = hello.gpu_uuid.as_deref().unwrap_or("-"),
                "trainer session opened"
            );
        }
        self.restarted(peer, &hello, &id, now);
        let alloc_limit = hello.alloc_limit;
        let asking = Asking::new(hello.can(CAP_ATTRIBUTION));
        let arming = Arming::new(hello.can(CAP_OOM_HISTORY));
        let job = jobs.join(&id, peer.pid, peer.uid, &hello, now);
        let subject = Subject {
            session: id.clone(),
            job: hello.job.clone(),
            run_id: hello.run_id.clone(),
            uid: Some(peer.uid),
            rank: hello.rank,
            pid: peer.pid,
            ns_pid: hello.ns_pid,
            gpu_uuid: hello.gpu_uuid.clone(),
        };
        self.live.insert(
            key,
            Session {
                id: id.clone(),
                peer,
                hello,
                started: now,
                last_sample: None,
                last_arrival: None,
                latest_ts: None,
                samples: 0,
                retries: Counter::default(),
                ooms: OomCount::default(),
                oom_log: ooms::Ooms::default(),
                ooms_survived: 0,
                alloc_limit,
                series: SessionSeries::new(self.limits.points),
                events: Bounded::new(self.limits.events),
                ended: None,
                subject,
                detect: SessionDetect::new(&self.detect),
                attribution: None,
                asking,
                arming,
                nvml: None,
                job,
                categories: Tracker::new(self.detect.headroom_margin_bytes),
                signal: None,
                exception: None,
            },
        );
        (key, id)
    }

    /// Held crash findings of ended sessions that `hello` restarts resolve: the trainer is back.
    fn restarted(&mut self, peer: Peer, hello: &Hello, id: &str, now: Timestamp) {
        let crashed: Vec<String> = self
            .ended
            .iter()
            .filter(|s| matches!(s.ended, Some((_, Ending::Crash | Ending::Stopped))))
            .filter(|s| same_trainer(s, peer, hello))
            .map(|s| ending_id(&s.id, s.ended.map(|e| e.1)))
            .collect();
        for f in crashed {
            self.findings
                .release(&f, now, &format!("restarted as {id}"));
        }
    }

    pub fn sample(&mut self, key: u64, mut s: Sample, now: Timestamp) {
        /// How far a sample's `ts` may be from its arrival: trainers run on this host, on its
        /// clock. Behind by up to an hour covers samples resent after a daemon restart, which
        /// keep their own time; beyond that, or ahead by more than 5 minutes, the clock or the
        /// client is wrong.
        const TS_BEHIND: f64 = 3600.0;
        const TS_AHEAD: f64 = 300.0;
        let Some(sess) = self.live.get_mut(&key) else {
            return;
        };
        if !(now - TS_BEHIND..=now + TS_AHEAD).contains(&s.ts) {
            // Not trusted: history and detectors take it at its arrival, so one bad clock can
            // neither stretch the history's time range nor skew rates per second.
            s.ts = now;
            self.timestamps_clamped += 1;
        }
        sess.retries.observe(s.stats.alloc_retries);
        sess.ooms.observe(s.stats.ooms);
        // Per trainer, the OOMs before this sample (counter or events); on the node, the `oom`
        // events only, as gpumon_ooms_total counts them, so survived never exceeds total there.
        self.oom_counts.survived += sess.oom_log.went_on(s.step);
        sess.ooms_survived = sess.ooms.total;
        sess.alloc_limit = s.alloc_limit.or(sess.alloc_limit);
        if let Some(c) = s.categories.take() {
            sess.categories.take(*c, s.ts, s.stats.allocated_peak);
        }
        let obs = Obs {
            sample: &s,
            retries_total: sess.retries.total,
            ooms_total: sess.ooms.total,
            alloc_limit: sess.alloc_limit,
            outside: nvml::outside_at(sess.nvml, &s),
            categories: Some(&sess.categories).filter(|c| c.measured > 0),
            world_size: sess.hello.world_size,
            alloc_conf: sess.hello.alloc_conf.as_deref(),
        };
        sess.detect.sample(&sess.subject, &obs, &mut self.findings);
        let point = point(&s.stats, s.step, s.phase.is_train());
        sess.series.push(s.ts, point);
        sess.samples += 1;
        sess.latest_ts = Some(sess.latest_ts.map_or(s.ts, |t| t.max(s.ts)));
        sess.last_arrival = Some(now);
        sess.last_sample = Some((s.ts, s));
    }

    pub fn event(&mut self, key: u64, mut e: Event) {
        if let Some(sess) = self.live.get_mut(&key) {
            // Dated no earlier than the session's previous line: clamped to it, and counted
            // with the other clamped times (a trainer's lines are sent in the order they happen).
            if let Some(prev) = sess.latest_ts.filter(|p| e.ts < *p) {
                e.ts = prev;
                self.timestamps_clamped += 1;
            }
            sess.latest_ts = Some(sess.latest_ts.map_or(e.ts, |t| t.max(e.ts)));
            sess.alloc_limit = e.alloc_limit.or(sess.alloc_limit);
            if e.kind == EventKind::Oom {
                sess.ooms.event();
                let step = sess.last_sample.as_ref().and_then(|(_, s)| s.step);
                sess.oom_log
                    .push(e.ts, step, e.alloc_bytes, e.explanation.as_deref());
                self.oom_counts.event(e.explanation.as_deref());
            }
            match Exit::of(&e) {
                Some(Exit::Signal(name)) => sess.signal = Some((e.ts, name)),
                Some(Exit::Exception(text)) if sess.exception.is_none() => {
                    sess.exception = Some(text)
                }
                _ => {}
            }
            let rec = EventRecord {
                ts: e.ts,
                kind: e.kind,
                detail: e
                    .detail
                    .or(e.path)
                    .or(e.phase.map(|p| p.as_str().to_string())),
                alloc_bytes: e.alloc_bytes,
                device_free: e.device_free,
                alloc_limit: sess.alloc_limit,
            };
            sess.detect.event(
                &sess.subject,
                &rec,
                e.explanation.as_deref(),
                &mut self.findings,
            );
            push_event(sess, rec);
        }
    }

    pub fn live(&self) -> impl Iterator<Item = &Session> {
        self.live.values()
    }

    pub fn ended(&self) -> impl Iterator<Item = &Session> {
        self.ended.iter()
    }

    /// Every session's finding firing now: live sessions' and held ones (crashes, a failure's
    /// cause). Orphaned memory is the store's (`Store::firing`).
    pub fn firing(&self) -> impl Iterator<Item = &crate::core::detect::Finding> {
        self.live
            .values()
            .flat_map(|s| s.detect.current())
            .filter(|f| f.state == crate::core::detect::FindingState::Firing)
            .chain(self.findings.held())
    }

    /// Time passes with no sample: held findings (crashes) expire.
    pub fn tick(&mut self, now: Timestamp) {
        self.findings.tick(now, self.detect.crash_hold_seconds);
    }

    /// A live or recently ended session by its id (`s-mi8dfxmo-17`; in a replay, the ids its
    /// daemon gave). An id of this store's numbering names its key; one given to `open_as` is
    /// looked for.
    pub fn get(&self, id: &str) -> Option<&Session> {
        let key = id
            .strip_prefix("s-")
            .and_then(|n| n.strip_prefix(self.id_prefix.as_str()))
            .and_then(|n| n.parse::<u64>().ok());
        key.and_then(|k| self.live.get(&k))
            .filter(|s| s.id == id)
            .or_else(|| self.live.values().find(|s| s.id == id))
            .or_else(|| self.ended.iter().find(|s| s.id == id))
    }

    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// A live session by its key.
    pub fn live_session(&self, key: u64) -> Option<&Session> {
        self.live.get(&key)
    }
}

fn point(st: &Stats, step: Option<u64>, train: bool) -> SessionPoint {
    SessionPoint {
        step,
        train,
        allocated: st.allocated,
        allocated_peak: st.allocated_peak,
        reserved: st.reserved,
    }
}

/// Whether `s` and a trainer saying `hello` from `peer` are one trainer run again: same user,
/// job and rank.
pub(super) fn same_trainer(s: &Session, peer: Peer, hello: &Hello) -> bool {
    s.peer.uid == peer.uid && s.hello.job == hello.job && s.hello.rank == hello.rank
}

pub(super) fn push_event(sess: &mut Session, e: EventRecord) {
    // Bounded by `SessionLimits::events` when the session was opened.
    sess.events.push(e);
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod survived_tests;

#[cfg(test)]
mod untracked_tests;

#[cfg(test)]
mod jobs_tests;

#[cfg(test)]
mod categories_tests;

#[cfg(test)]
mod stops_tests;
