//! The one place the state changes: `Core::apply` takes a typed input (input.rs) and applies it
//! to the store: a collection, a connection's parsed lines (a hello opens a session, samples,
//! events and answers go to it, bye ends it, and the requests due to it come back), a close
//! (crash, daemon stopped, idle) or a replayed trace note. The aggregator thread calls it for the
//! daemon and `gpumon analyze` calls it directly, so live and offline share every rule, finding
//! transitions and their GPU included.

use crate::core::detect::Finding;
use crate::core::input::{
    Applied, Close, Closed, Closing, Input, Lines, Link, Note, Opened, Output, Refusal, Request,
};
use crate::core::message::Message;
use crate::core::model::Timestamp;
use crate::core::store::sessions::Sessions;
use crate::core::store::{HistoryLimits, Store};
use crate::core::trace;
use crate::core::trainer::{Ending, Event, EventKind, Hello};
use crate::core::unified;

pub struct Core {
    store: Store,
    /// A replay's unified-memory figures per session (`trace_unified`).
    replayed: unified::Replayed,
}

impl Core {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            replayed: Default::default(),
        }
    }

    /// A core without NVML history (a replay, a test), holding `sessions`.
    pub fn with_sessions(sessions: Sessions) -> Self {
        let mut store = Store::new(HistoryLimits { gpu_points: 1 }, 1.0, String::new());
        store.set_sessions(sessions);
        Self::new(store)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn sessions(&self) -> &Sessions {
        &self.store.sessions
    }

    /// Applies any input (the aggregator's path). Callers that know what they send (a
    /// connection in-process, `gpumon analyze`) call the arm itself: the same code.
    pub fn apply(&mut self, input: Input) -> Output {
        match input {
            Input::Collection(c) => {
                self.store.apply_collection(*c);
                Output::Applied
            }
            Input::Lines(lines) => Output::Lines(self.lines(lines)),
            Input::Close(c) => Output::Closed(self.close(c)),
            Input::Note(link, note) => {
                self.note(link, note);
                Output::Applied
            }
        }
    }

    /// The finding transitions raised since the last call, each with its GPU resolved by the
    /// store's one lookup (what alerts and `gpumon analyze` report).
    pub fn transitions(&mut self) -> Vec<Finding> {
        let mut raised = self.store.sessions.findings.drain();
        for f in &mut raised {
            self.store.resolve_gpu(f);
        }
        raised
    }

    /// Transitions lost past the findings' outbox so far.
    pub fn outbox_dropped(&self) -> u64 {
        self.store.sessions.findings.outbox_dropped()
    }

    /// A connection's lines, in order; then, when asked, the requests due to its session.
    pub fn lines(&mut self, mut batch: Box<Lines>) -> Box<Lines> {
        let Lines {
            link,
            now,
            messages,
            applied,
            ask,
            requests,
            session_id,
        } = &mut *batch;
        for msg in messages.drain(..) {
            applied.push(self.message(link, session_id, msg, *now));
        }
        if let (true, Some(key)) = (*ask, link.session) {
            let sessions = &mut self.store.sessions;
            if let Some(r) = sessions.request_due(key, *now) {
                requests.push(Request::Attribute(r));
            }
            if let Some(r) = sessions.arm_due(key, *now) {
                requests.push(Request::Arm(r));
            }
        }
        batch
    }

    /// One message on the connection `link`: hello first and once, then the session's lines.
    fn message(
        &mut self,
        link: &mut Link,
        id: &mut Option<String>,
        msg: Message,
        now: Timestamp,
    ) -> Applied {
        let accepted = Applied::Accepted { note: None };
        let Some(key) = link.session else {
            return match msg {
                Message::Hello(h) => self.open(link, id.take(), h, now),
                _ => Applied::Refused(Refusal::NoHello),
            };
        };
        let sessions = &mut self.store.sessions;
        match msg {
            Message::Hello(_) => Applied::Refused(Refusal::DuplicateHello),
            Message::Sample(s) => {
                // The figure this sample is paired with, noted ahead of it, as analyze replays it.
                let note = if link.recorded {
                    sessions.nvml_line(key, &mut link.nvml_noted)
                } else {
                    None
                };
                let room = match self.store.latest() {
                    Some(r) => unified::room_of(Some(r), self.store.sessions.live_session(key)),
                    None => self.replayed.get(key),
                };
                let note = match (note, link.recorded) {
                    (note, false) => note,
                    (note, true) => join_notes(note, unified::line(room, &mut link.unified_noted)),
                };
                self.store
                    .sessions
                    .sample(key, unified::bound(s, room), now);
                Applied::Accepted { note }
            }
            Message::Event(e) => {
                sessions.event(key, e);
                accepted
            }
            Message::Attribution(a) => match sessions.attribution(key, a) {
                Ok(()) => accepted,
                Err(e) => Applied::Refused(Refusal::Unasked(e)),
            },
            Message::Armed(a) => match sessions.armed(key, a) {
                Ok(()) => accepted,
                Err(e) => Applied::Refused(Refusal::UnaskedArm(e)),
            },
            Message::Peak(p) => match sessions.peak(key, p) {
                Ok(()) => accepted,
                Err(e) => Applied::Refused(Refusal::UnaskedArm(e)),
            },
            Message::Bye { .. } => {
                self.store.close(key, Ending::Clean, now);
                link.session = None;
                Applied::Ended
            }
        }
    }

    /// Opens the session of `link`'s hello, under `id` when one is given (`Lines::session_id`).
    fn open(&mut self, link: &mut Link, id: Option<String>, h: Hello, now: Timestamp) -> Applied {
        let (job, rank) = match link.recorded {
            true => (h.job.clone(), h.rank),
            false => (None, None),
        };
        let trace_gpu = link.recorded.then(|| self.trace_gpu(&h, now)).flatten();
        let (key, id) = match id {
            Some(id) => self.store.open_as(id, link.peer, h, now),
            None => self.store.open(link.peer, h, now),
        };
        link.session = Some(key);
        Applied::Opened(Box::new(Opened {
            id,
            job,
            rank,
            trace_gpu,
        }))
    }

    /// The `trace_gpu` line for a recorded hello, when NVML lists the device it names, so
    /// `gpumon analyze` names the GPU the live findings did.
    fn trace_gpu(&self, h: &Hello, now: Timestamp) -> Option<Vec<u8>> {
        let uuid = h.gpu_uuid.as_deref()?;
        let gpu = self.store.gpu_index(uuid)?;
        Some(trace::gpu_line(gpu, uuid, now))
    }

    /// A connection ending: its session, if one is open, ends as `c.how` says.
    pub fn close(&mut self, c: Close) -> Closed {
        let Some(key) = c.link.session else {
            return Closed { note: None };
        };
        let (store, now) = (&mut self.store, c.now);
        let note = match c.how {
            Closing::Crash => {
                store.close(key, Ending::Crash, now);
                Some(trace::closed_line(now))
            }
            // The daemon is going away, not the trainer: its trace says so, and analyze reads
            // no crash into the end either.
            Closing::DaemonStopped => {
                store.close_as(key, Ending::Clean, now, trace::DAEMON_STOPPED);
                Some(trace::ended_line(trace::DAEMON_STOPPED, now))
            }
            // The trainer may well be alive (stuck, or between steps longer than the idle
            // timeout): no crash, and an `idle_timeout` event says why it ended.
            Closing::Idle(detail) => {
                let kind = EventKind::IdleTimeout;
                let line = serde_json::json!({
                    "type": "event", "ts": now, "kind": kind.as_str(), "detail": &detail,
                });
                store.sessions.event(key, idle_event(now, detail));
                store.close_as(key, Ending::Clean, now, kind.as_str());
                Some(line.to_string().into_bytes())
            }
        };
        Closed {
            note: note.filter(|_| c.link.recorded),
        }
    }

    /// A replayed trace note, for the connection's session.
    pub fn note(&mut self, link: Link, note: Note) {
        let Some(key) = link.session else { return };
        match note {
            Note::Nvml(figure) => self.store.sessions.noted_nvml(key, figure),
            Note::Unified(room) => self.replayed.note(key, room),
            Note::Gpu(gpu) => {
                let sessions = &self.store.sessions;
                let uuid = sessions
                    .live_session(key)
                    .and_then(|s| s.hello.gpu_uuid.clone());
                if let Some(uuid) = uuid {
                    self.store.note_gpu(uuid, gpu);
                }
            }
        }
    }
}

/// Two notes to write before a line, one after the other (each a line of the trace).
fn join_notes(a: Option<Vec<u8>>, b: Option<Vec<u8>>) -> Option<Vec<u8>> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.push(b'\n');
            a.extend_from_slice(&b);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

fn idle_event(now: Timestamp, detail: String) -> Event {
    Event {
        ts: now,
        kind: EventKind::IdleTimeout,
        alloc_bytes: None,
        device_free: None,
        alloc_limit: None,
        phase: None,
        detail: Some(detail),
        path: None,
        dropped: None,
        explanation: None,
        ending: None,
    }
}

#[cfg(test)]
mod tests;
