//! One node's record directory replayed as its daemon lived it: one core, built as the daemon
//! builds it, every run of traces a connection, their lines applied in time order across runs
//! (the order the daemon took them in), each as a batch of the connection's parsed lines.
//! Requests the core makes of a trainer are dropped, since nobody can answer a replay; the
//! answers the trace holds were taken live, and are taken here as they were.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use super::cursor::{Cursor, Step};
use super::ids::Ids;
use super::{stitch, Found, Trace, Unreadable};
use crate::core::apply::Core;
use crate::core::detect::{DetectConfig, FindingState};
use crate::core::input::{Applied, Closing, Input, Lines, Output};
use crate::core::jobs::{JobView, Member};
use crate::core::message::Message;
use crate::core::model::Timestamp;
use crate::core::store::sessions::Sessions;
use crate::core::trainer::{EventKind, Peer};
use crate::sources::ingest::conn::{Conn, Outcome};
use crate::sources::ingest::protocol::Rejection;
use crate::sources::ingest::resume::Resume;

/// What one node's replay found: its traces, each with its findings, and its jobs.
pub struct Node {
    pub traces: Vec<Trace>,
    pub jobs: Vec<JobView>,
}

/// A run's next step, ordered by time (then by run, so equal times keep the files' order).
struct Due {
    ts: Timestamp,
    run: usize,
}

impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    // Reversed: `BinaryHeap` is a max-heap, and the earliest comes first.
    fn cmp(&self, o: &Self) -> Ordering {
        o.ts.total_cmp(&self.ts).then(o.run.cmp(&self.run))
    }
}

struct Replay {
    core: Core,
    runs: Vec<Cursor>,
    /// Each run's next step, taken out of it.
    next: Vec<Option<Step>>,
    /// The run each session was opened by.
    sessions: HashMap<String, usize>,
    /// Session ids, each run's as its daemon gave it (ids.rs), until its session opens.
    ids: Ids,
    /// Each finding's run and place in its trace's findings.
    seen: HashMap<String, (usize, usize)>,
    /// The batch the lines go in, reused.
    batch: Option<Box<Lines>>,
}

/// Replays the files of one node; a run that cannot be read is named in `errors`.
pub fn replay(files: Vec<PathBuf>, cfg: DetectConfig, errors: &mut Vec<Unreadable>) -> Node {
    // As the daemon builds its sessions (daemon.rs), with the default policies a config
    // without those sections gives.
    let sessions = Sessions::new(Default::default()).with_detect(cfg);
    let resume = Arc::new(Resume::default());
    let mut r = Replay {
        core: Core::with_sessions(sessions),
        runs: Vec::new(),
        next: Vec::new(),
        sessions: HashMap::new(),
        ids: Ids::default(),
        seen: HashMap::new(),
        batch: None,
    };
    let mut due = BinaryHeap::new();
    let mut recorded = Vec::new();
    for run in stitch::runs(files) {
        let head = run
            .first()
            .and_then(|f| stitch::head(f))
            .unwrap_or_default();
        let peer = Peer {
            pid: head.pid.unwrap_or(0),
            uid: head.uid.unwrap_or(0),
            gid: 0,
        };
        // Acknowledging, so a resent line (an `instance` and `seq` already taken) is dropped.
        let mut c = Cursor::new(run, Conn::new(peer).acking(resume.clone()));
        match c.next() {
            Ok(step) => {
                due.push(Due {
                    ts: step_ts(&step),
                    run: r.runs.len(),
                });
                r.runs.push(c);
                r.next.push(Some(step));
                recorded.push(head.session);
            }
            Err(e) => errors.push(e),
        }
    }
    r.ids = Ids::recorded(recorded);
    let mut failed = vec![false; r.runs.len()];
    while let Some(Due { run, .. }) = due.pop() {
        let Some(step) = r.next.get_mut(run).and_then(Option::take) else {
            continue;
        };
        match step {
            Step::Line { msg, seq, ts } => r.line(run, msg, seq, ts),
            Step::End { .. } => {
                r.end(run);
                continue;
            }
        }
        r.collect();
        let Some(c) = r.runs.get_mut(run) else {
            continue;
        };
        match c.next() {
            Ok(step) => {
                due.push(Due {
                    ts: step_ts(&step),
                    run,
                });
                r.next[run] = Some(step);
            }
            Err(e) => {
                // Unreadable part way: named, and its session closed as the daemon would
                // never have seen more of it.
                errors.push(e);
                failed[run] = true;
                r.end(run);
            }
        }
    }
    r.collect();
    let jobs = r.jobs();
    let mut traces = Vec::new();
    for (i, c) in r.runs.into_iter().enumerate() {
        if failed[i] {
            continue;
        }
        if c.accepted == 0 {
            errors.push(Unreadable {
                file: c.trace.file.clone(),
                reason: format!(
                    "no valid protocol line in {} line(s); a trace starts with a hello line",
                    c.trace.bad_line_count
                ),
            });
            continue;
        }
        traces.push(c.trace);
    }
    Node { traces, jobs }
}

fn step_ts(s: &Step) -> Timestamp {
    match s {
        Step::Line { ts, .. } | Step::End { ts } => *ts,
    }
}

impl Replay {
    /// One line of run `run`, applied by the core as a batch of one at its own time.
    fn line(&mut self, run: usize, msg: Message, seq: Option<u64>, ts: Timestamp) {
        let Some(c) = self.runs.get_mut(run) else {
            return;
        };
        for note in c.notes.drain(..) {
            self.core.apply(Input::Note(c.conn.link(), note));
        }
        let hello = match &msg {
            Message::Hello(h) => Some((h.job.clone(), h.rank)),
            _ => None,
        };
        let mut batch = self
            .batch
            .take()
            .unwrap_or_else(|| Box::new(Lines::new(c.conn.link())));
        batch.messages.clear();
        batch.applied.clear();
        let pending = match c.conn.take(msg, seq, &mut batch.messages) {
            Ok(p) => p,
            Err(outcome) => {
                // Sent again after a restart: in the earlier trace already.
                if outcome == Outcome::Duplicate {
                    c.trace.duplicates += 1;
                }
                self.batch = Some(batch);
                return;
            }
        };
        batch.link = c.conn.link();
        batch.now = ts;
        // The id the daemon gave, should this line open the session; the core numbers a run
        // whose trace names none.
        batch.session_id = match hello {
            Some(_) if batch.link.session.is_none() => Some(self.ids.take(run)),
            _ => None,
        };
        // Asked as the daemon asks after each batch, so its windows and arms open as they did
        // live and the recorded answers find them; the requests themselves go nowhere.
        batch.ask = true;
        let Output::Lines(mut batch) = self.core.apply(Input::Lines(batch)) else {
            return;
        };
        c.conn.moved_on(batch.link);
        batch.requests.clear();
        match batch.applied.pop() {
            Some(Applied::Refused(r)) => c.bad(&Rejection::from(r)),
            Some(a) => {
                c.accepted += 1;
                c.clock = ts;
                let ended = a == Applied::Ended;
                if let Applied::Opened(o) = &a {
                    self.sessions.insert(o.id.clone(), run);
                    c.trace.session = Some(o.id.clone());
                    if let Some((job, rank)) = hello {
                        c.trace.job = job;
                        c.trace.rank = rank;
                    }
                }
                c.conn.applied(a, pending, &[], ts);
                if ended {
                    samples(&self.core, c);
                }
            }
            None => {}
        }
        self.batch = Some(batch);
    }

    /// Run `run` is read to its end: its connection closes as the trace says it did.
    fn end(&mut self, run: usize) {
        let Some(c) = self.runs.get_mut(run) else {
            return;
        };
        for note in c.notes.drain(..) {
            self.core.apply(Input::Note(c.conn.link(), note));
        }
        let live = c
            .conn
            .link()
            .session
            .and_then(|k| self.core.sessions().live_session(k));
        if live.is_none() {
            return;
        }
        // The daemon closed the connection for going quiet (its `idle_timeout` event ends the
        // trace): the trainer may be alive, as the daemon itself recorded no crash.
        let idle = live
            .and_then(|s| s.events.back())
            .is_some_and(|e| e.kind == EventKind::IdleTimeout);
        let how = if c.trace.truncated.is_some() || c.trace.ended.is_some() || idle {
            // What happened after the trace stops is unknown: no crash is read into it.
            Closing::DaemonStopped
        } else {
            Closing::Crash
        };
        self.core.apply(Input::Close(c.conn.closing(how, c.clock)));
        samples(&self.core, c);
        self.collect();
    }

    /// The finding transitions since the last look, each on its session's trace: a finding
    /// is listed once it fires, in the order findings first fired, as it stands last.
    fn collect(&mut self) {
        for f in self.core.transitions() {
            if let Some(&(run, i)) = self.seen.get(&f.id) {
                if let Some(slot) = self
                    .runs
                    .get_mut(run)
                    .and_then(|c| c.trace.findings.get_mut(i))
                {
                    slot.finding = f;
                }
                continue;
            }
            if f.state != FindingState::Firing {
                continue;
            }
            let Some(&run) = self.sessions.get(&f.subject.session) else {
                continue;
            };
            let Some(c) = self.runs.get_mut(run) else {
                continue;
            };
            self.seen
                .insert(f.id.clone(), (run, c.trace.findings.len()));
            let fired = f.evidence.clone();
            c.trace.findings.push(Found { finding: f, fired });
        }
    }

    /// The node's jobs as its daemon judged them at the end, each member with its trace.
    fn jobs(&self) -> Vec<JobView> {
        let host = self.runs.iter().find_map(|c| c.trace.host.clone());
        let files: HashMap<&str, &Trace> = self
            .runs
            .iter()
            .filter_map(|c| Some((c.trace.session.as_deref()?, &c.trace)))
            .collect();
        crate::core::snapshot::jobs::views_named(
            self.core.store(),
            host.as_deref().unwrap_or(""),
            |m: &mut Member| {
                if let Some(t) = files.get(m.session.as_str()) {
                    m.file = Some(t.file.clone());
                    // Its own `trace_host`; none when the trace has none (an older daemon's).
                    m.host = t.host.clone();
                }
            },
        )
    }
}

/// The session's samples, as it ended.
fn samples(core: &Core, c: &mut Cursor) {
    let s = c
        .trace
        .session
        .as_deref()
        .and_then(|id| core.sessions().get(id));
    if let Some(s) = s {
        c.trace.samples = s.samples;
    }
}
