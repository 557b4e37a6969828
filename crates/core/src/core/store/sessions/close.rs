//! A session's end, in the order its parts hear of it: the session itself (its window, its
//! arming, the crash or stop it ended by, its event), its job (which may name it a consequence
//! of another rank's failure, or overturn an earlier cause), its findings (resolved, or held
//! as the cause), and a trainer that came back before the close was read.

use super::{push_event, same_trainer, Session, Sessions};
use crate::core::detect::findings::ConsequenceOf;
use crate::core::detect::session::{ending_id, End};
use crate::core::detect::{crash, FindingState, Kind};
use crate::core::jobs::{Classified, Failure, Jobs, MemberFinding};
use crate::core::model::Timestamp;
use crate::core::trainer::{Ending, EventRecord};

impl Sessions {
    /// Ends session `key`, telling its job in `jobs` that it left.
    pub fn close(&mut self, jobs: &mut Jobs, key: u64, ending: Ending, now: Timestamp) {
        let how = match ending {
            Ending::Clean => "bye",
            Ending::Crash => "crash (no bye)",
            Ending::Stopped => "stopped (no bye, after a signal)",
        };
        self.close_as(jobs, key, ending, now, how);
    }

    /// `close`, with how it ended in words for the log line (`idle_timeout`, `daemon_stopped`).
    pub fn close_as(
        &mut self,
        jobs: &mut Jobs,
        key: u64,
        ending: Ending,
        now: Timestamp,
        how: &str,
    ) {
        let Some(mut sess) = self.live.remove(&key) else {
            return;
        };
        self.log_close(&sess, now, how);
        sess.end_window(now);
        sess.end_arming();
        let failure = (ending != Ending::Clean).then(|| failure_of(&sess, now));
        // A trainer that said it received a signal was stopped, not failed.
        let ending = match &failure {
            Some(f) if f.kind == Kind::Stopped => Ending::Stopped,
            _ => ending,
        };
        sess.end(ending, now);
        let died_of_oom = failure.as_ref().is_some_and(|f| f.kind == Kind::Oom);
        let verdict = self.leave_job(jobs, &sess, failure, now);
        self.close_findings(&mut sess, ending, died_of_oom, verdict.consequence_of, now);
        if ending != Ending::Clean {
            self.release_if_back(&sess, ending, now);
        }
        self.ended.push(sess);
    }

    fn log_close(&mut self, sess: &Session, now: Timestamp, how: &str) {
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
    }

    /// Tells the session's job in `jobs` it left (with `failure` when it failed), and makes the
    /// sessions whose failure this one overturns as the cause consequences of it.
    fn leave_job(
        &mut self,
        jobs: &mut Jobs,
        sess: &Session,
        failure: Option<Failure>,
        now: Timestamp,
    ) -> Classified {
        let Some(job) = sess.job else {
            return Classified::default();
        };
        // What was firing as it ended (before its findings close), for the job's story.
        let firing = sess
            .detect
            .current()
            .filter(|f| f.state == FindingState::Firing)
            .filter(|f| !matches!(f.kind, Kind::Crash | Kind::Oom | Kind::Stopped))
            .map(|f| MemberFinding {
                kind: f.kind,
                message: f.message.clone(),
            })
            .collect();
        let verdict = jobs.left(job, &sess.id, now, failure, firing);
        for (session, of) in &verdict.relabel {
            self.findings.relabel(session, of, now);
        }
        verdict
    }

    /// The session's findings end with it: resolved, or held (a crash, an OOM it died of),
    /// named a consequence when its failure followed another rank's.
    fn close_findings(
        &mut self,
        sess: &mut Session,
        ending: Ending,
        died_of_oom: bool,
        consequence_of: Option<ConsequenceOf>,
        now: Timestamp,
    ) {
        let end = End {
            ending,
            last: sess.last_sample.as_ref().map(|(_, s)| s),
            now,
            died_of_oom,
            consequence_of,
            signal: sess.signal.as_ref().map(|(_, s)| s.as_str()),
            exception: sess.exception.as_deref(),
        };
        self.findings.closing(Some(sess.peer.uid));
        sess.detect.close(&sess.subject, &end, &mut self.findings);
        self.findings.closing(None);
    }

    /// A trainer restarted at once may say hello before its old connection's close is read:
    /// the crash is over already if so.
    fn release_if_back(&mut self, sess: &Session, ending: Ending, now: Timestamp) {
        let back = self
            .live
            .values()
            .find(|s| s.started >= sess.started && same_trainer(s, sess.peer, &sess.hello));
        if let Some(back) = back {
            let why = format!("restarted as {}", back.id);
            self.findings
                .release(&ending_id(&sess.id, Some(ending)), now, &why);
        }
    }
}

impl Session {
    /// Marks the session ended by `ending`, with an event saying how when it did not say bye.
    fn end(&mut self, ending: Ending, now: Timestamp) {
        if ending != Ending::Clean {
            let (kind, detail) = match (&ending, &self.signal, &self.exception) {
                (Ending::Stopped, Some((_, sig)), _) => (
                    "stopped",
                    format!("connection closed without bye after {sig}: the trainer was stopped"),
                ),
                (_, _, Some(x)) => (
                    "crash",
                    format!("connection closed without bye: the trainer died of {x}"),
                ),
                _ => (
                    "crash",
                    "connection closed without bye: the trainer exited or was killed".into(),
                ),
            };
            push_event(
                self,
                EventRecord {
                    ts: now,
                    kind: kind.into(),
                    detail: Some(detail),
                    alloc_bytes: None,
                    device_free: None,
                    alloc_limit: None,
                },
            );
        }
        self.ended = Some((now, ending));
        // The ring was allocated whole for a running session (115 KB at 3600 points); an ended
        // one grows no more: keep only its points.
        self.series.shrink_to_fit();
    }
}

/// How a session that closed without bye failed: of the OOM it did not go on from (its time and
/// step), else a crash at the close.
fn failure_of(sess: &Session, now: Timestamp) -> Failure {
    let unsurvived = sess.oom_log.ooms.front().filter(|o| !o.survived);
    let last_step = sess.last_sample.as_ref().and_then(|(_, s)| s.step);
    if let Some(o) = unsurvived {
        // The trainer's clock, trusted as a sample's is: within the hour before the close.
        let sane = (now - 3600.0..=now + 300.0).contains(&o.ts);
        return Failure {
            kind: Kind::Oom,
            ts: if sane { o.ts } else { now },
            step: o.step.or(last_step),
            message: sess
                .detect
                .firing(Kind::Oom)
                .map_or_else(|| "CUDA out of memory".to_string(), |f| f.message.clone()),
            exception: None,
            signal: None,
        };
    }
    if sess.ooms.total > sess.ooms_survived {
        return Failure {
            kind: Kind::Oom,
            ts: now,
            step: last_step,
            message: "CUDA out of memory (the allocator's counter rose; no oom event)".into(),
            exception: None,
            signal: None,
        };
    }
    let mut evidence = crash::evidence(sess.last_sample.as_ref().map(|(_, s)| s));
    // A signal counts as the end when the close came within the grace a trainer gets to
    // checkpoint and exit; one that handled it and went on longer, then died, crashed.
    let stopped = sess
        .signal
        .as_ref()
        .filter(|(ts, _)| now - ts <= crash::STOP_GRACE_SECONDS);
    let kind = match stopped {
        Some((_, sig)) => {
            evidence.signal = Some(sig.clone());
            Kind::Stopped
        }
        None => {
            evidence.exception = sess.exception.clone();
            Kind::Crash
        }
    };
    Failure {
        kind,
        ts: now,
        step: last_step,
        message: crate::core::detect::message::describe(kind, &evidence),
        exception: evidence.exception,
        signal: evidence.signal,
    }
}
