//! Trainer sessions: what each instrumented trainer has pushed, bounded per session and in
//! count. A session lives from `hello` until its connection ends; ended sessions are kept a
//! short while (for the API and the crash record) and then dropped.

mod arm;
mod attribute;
pub mod nvml;
pub mod ooms;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::session_series::SessionSeries;
use crate::core::detect::attribution::Attribution;
use crate::core::detect::findings::log_limit::LogLimit;
use crate::core::detect::findings::Subject;
use crate::core::detect::session::crash_id;
use crate::core::detect::{DetectConfig, Findings, Obs, SessionDetect};
use crate::core::model::Timestamp;
use crate::core::trainer::{
    Ending, Event, EventKind, EventRecord, Hello, Peer, Sample, SessionPoint, Stats,
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
    /// How live sessions ask for attributions; None in a replay.
    policy: Option<AttributionPolicy>,
    /// How live sessions are armed before an OOM; None in a replay.
    arming: Option<OomPolicy>,
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
            policy: None,
            arming: None,
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

    /// Opens a session and returns its key and its id string (`s-17`). A trainer that comes
    /// back (same user, job and rank as a session that crashed) resolves that crash.
    pub fn open(&mut self, peer: Peer, hello: Hello, now: Timestamp) -> (u64, String) {
        let key = self.next_id;
        self.next_id += 1;
        let id = format!("s-{}{key}", self.id_prefix);
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
        let subject = Subject {
            session: id.clone(),
            job: hello.job.clone(),
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
            },
        );
        (key, id)
    }

    /// Held crash findings of ended sessions that `hello` restarts resolve: the trainer is back.
    fn restarted(&mut self, peer: Peer, hello: &Hello, id: &str, now: Timestamp) {
        let crashed: Vec<String> = self
            .ended
            .iter()
            .filter(|s| matches!(s.ended, Some((_, Ending::Crash))))
            .filter(|s| same_trainer(s, peer, hello))
            .map(|s| crash_id(&s.id))
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
        let obs = Obs {
            sample: &s,
            retries_total: sess.retries.total,
            ooms_total: sess.ooms.total,
            alloc_limit: sess.alloc_limit,
            outside: nvml::outside_at(sess.nvml, &s),
        };
        sess.detect.sample(&sess.subject, &obs, &mut self.findings);
        let point = point(&s.stats, s.step, s.phase.is_train());
        sess.series.push(s.ts, point);
        sess.samples += 1;
        sess.last_arrival = Some(now);
        sess.last_sample = Some((s.ts, s));
    }

    pub fn event(&mut self, key: u64, e: Event) {
        if let Some(sess) = self.live.get_mut(&key) {
            sess.alloc_limit = e.alloc_limit.or(sess.alloc_limit);
            if e.kind == EventKind::Oom {
                sess.ooms.event();
                let step = sess.last_sample.as_ref().and_then(|(_, s)| s.step);
                sess.oom_log
                    .push(e.ts, step, e.alloc_bytes, e.explanation.as_deref());
                self.oom_counts.event(e.explanation.as_deref());
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

    pub fn close(&mut self, key: u64, ending: Ending, now: Timestamp) {
        let how = match ending {
            Ending::Clean => "bye",
            Ending::Crash => "crash (no bye)",
        };
        self.close_as(key, ending, now, how);
    }

    /// `close`, with how it ended in words for the log line (`idle_timeout`, `daemon_stopped`).
    pub fn close_as(&mut self, key: u64, ending: Ending, now: Timestamp, how: &str) {
        let Some(mut sess) = self.live.remove(&key) else {
            return;
        };
        if self.log.as_mut().is_some_and(|l| l.allow(now)) {
            tracing::info!(
                session = %sess.id,
                job = sess.hello.job.as_deref().unwrap_or("-"),
                pid = sess.peer.pid,
                samples = sess.samples,
                ended = how,
                "trainer session closed"
            );
        }
        sess.end_window(now);
        sess.end_arming();
        if ending == Ending::Crash {
            let detail =
                Some("connection closed without bye: the trainer exited or was killed".into());
            push_event(
                &mut sess,
                EventRecord {
                    ts: now,
                    kind: "crash".into(),
                    detail,
                    alloc_bytes: None,
                    device_free: None,
                    alloc_limit: None,
                },
            );
        }
        sess.ended = Some((now, ending));
        // The ring was allocated whole for a running session (115 KB at 3600 points); an ended
        // one grows no more: keep only its points.
        sess.series.shrink_to_fit();
        let last = sess.last_sample.as_ref().map(|(_, s)| s);
        self.findings.closing(Some(sess.peer.uid));
        sess.detect
            .close(&sess.subject, ending, last, now, &mut self.findings);
        self.findings.closing(None);
        if ending == Ending::Crash {
            // A trainer restarted at once may say hello before its old connection's close is
            // read: the crash is over already if so.
            let back = self
                .live
                .values()
                .find(|s| s.started >= sess.started && same_trainer(s, sess.peer, &sess.hello));
            if let Some(back) = back {
                let why = format!("restarted as {}", back.id);
                self.findings.release(&crash_id(&sess.id), now, &why);
            }
        }
        self.ended.push(sess);
    }

    pub fn live(&self) -> impl Iterator<Item = &Session> {
        self.live.values()
    }

    pub fn ended(&self) -> impl Iterator<Item = &Session> {
        self.ended.iter()
    }

    /// Every finding firing now: live sessions' and held crashes.
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

    /// A live or recently ended session by its id (`s-mi8dfxmo-17`; `s-17` in a replay).
    pub fn get(&self, id: &str) -> Option<&Session> {
        let key = id
            .strip_prefix("s-")?
            .strip_prefix(self.id_prefix.as_str())?
            .parse::<u64>()
            .ok()?;
        self.live
            .get(&key)
            .filter(|s| s.id == id)
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
fn same_trainer(s: &Session, peer: Peer, hello: &Hello) -> bool {
    s.peer.uid == peer.uid && s.hello.job == hello.job && s.hello.rank == hello.rank
}

fn push_event(sess: &mut Session, e: EventRecord) {
    // Bounded by `SessionLimits::events` when the session was opened.
    sess.events.push(e);
}

#[cfg(test)]
mod tests {
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
        // A restart 1 ms later.
        let mut after = Sessions::new(SessionLimits::default()).with_id_epoch(1_763_700_000.001);
        let (_, a) = before.open(PEER, hello(), 0.0);
        let (_, b) = after.open(PEER, hello(), 0.0);
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
        for round in 0..10 {
            let (key, id) = s.open(PEER, hello(), 0.0);
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
                    },
                );
            }
            let sess = s.live().next().unwrap();
            assert_eq!(sess.series.len(), 5);
            assert_eq!(sess.events.len(), 3);
            s.close(key, Ending::Crash, 1.0);
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
        let (a, _) = s.open(PEER, hello(), 0.0);
        s.open(PEER, hello(), 0.0);
        s.close(a, Ending::Clean, 1.0);
        assert!(s.get("s-1").unwrap().ended.is_some());
        assert!(s.get("s-2").unwrap().ended.is_none());
        for missing in ["s-3", "s-02", "2", "s-", "s-x"] {
            assert!(s.get(missing).is_none(), "{missing}");
        }
    }

    #[test]
    fn a_clean_bye_records_no_crash() {
        let mut s = Sessions::new(SessionLimits::default());
        let (key, _) = s.open(PEER, hello(), 0.0);
        s.sample(key, sample(1.0, 2), 1.0);
        s.close(key, Ending::Clean, 2.0);
        let sess = s.ended().next().unwrap();
        assert!(sess.events.is_empty());
        assert_eq!(sess.retries.total, 2);
    }

    #[test]
    fn the_session_keeps_the_latest_alloc_limit() {
        const GIB: u64 = 1 << 30;
        let mut s = Sessions::new(SessionLimits::default());
        let (key, _) = s.open(
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
        let (key, _) = s.open(PEER, hello(), 0.0);
        s.sample(key, with_ooms(1.0, 0), 1.0);
        s.event(key, oom(2.0));
        assert_eq!(s.live().next().unwrap().ooms.total, 1);
        s.close(key, Ending::Crash, 3.0);
        assert_eq!(s.ended().next().unwrap().ooms.total, 1);
    }

    #[test]
    fn an_oom_seen_as_event_and_counter_counts_once() {
        let mut s = Sessions::new(SessionLimits::default());
        let (key, _) = s.open(PEER, hello(), 0.0);
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
        let node = |s: &Sessions| {
            let total: u64 = s.oom_counts.by_pattern().map(|(_, n)| n).sum();
            (total, s.oom_counts.survived)
        };
        // Trainer A: an OOM seen only as a counter rise (no observer), and it went on.
        let (a, ida) = s.open(PEER, hello(), 0.0);
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
        let (old, _) = s.open(PEER, hello(), 0.0);
        // The new connection's hello is handled first, then the old one's EOF.
        let (_, id) = s.open(PEER, hello(), 5.0);
        s.close(old, Ending::Crash, 5.1);
        assert_eq!(s.firing().filter(|f| f.kind == Kind::Crash).count(), 0);
        let resolved = s.findings.recent().last().unwrap();
        assert!(resolved.message.ends_with(&format!("restarted as {id}")));
        // A session that was already running beside it (started earlier) is not a restart.
        let rank3 = || Hello {
            rank: Some(3),
            ..hello()
        };
        s.open(PEER, rank3(), 6.0);
        let (later, _) = s.open(PEER, rank3(), 7.0);
        s.close(later, Ending::Crash, 8.0);
        assert_eq!(s.firing().filter(|f| f.kind == Kind::Crash).count(), 1);
    }

    #[test]
    fn a_trainer_restarting_resolves_its_crash() {
        use crate::core::detect::{FindingState, Kind};
        let mut s = Sessions::new(SessionLimits::default());
        let (a, _) = s.open(PEER, hello(), 0.0);
        let (other, _) = s.open(
            PEER,
            Hello {
                rank: Some(1),
                ..hello()
            },
            0.0,
        );
        s.close(a, Ending::Crash, 5.0);
        s.close(other, Ending::Crash, 5.0);
        assert_eq!(s.firing().filter(|f| f.kind == Kind::Crash).count(), 2);
        // Another user with the same job and rank is not this trainer.
        s.open(Peer { uid: 7, ..PEER }, hello(), 6.0);
        assert_eq!(s.firing().filter(|f| f.kind == Kind::Crash).count(), 2);
        let (_, id) = s.open(PEER, hello(), 7.0);
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
        s.open(PEER, hello(), 8.0);
        assert_eq!(s.findings.recent().count(), before);
    }
}

#[cfg(test)]
mod survived_tests;

#[cfg(test)]
mod untracked_tests;
