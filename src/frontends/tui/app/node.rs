//! One data source's view: where it comes from, whether it answers, its latest snapshot, the
//! findings read from it, and the per-GPU memory history the sparklines draw.

use std::collections::{BTreeMap, VecDeque};

use crate::core::model::{GpuState, Timestamp};
use crate::core::snapshot::{GpuView, Snapshot};
use crate::frontends::tui::finding::{Finding, FindingView, State};

/// Seconds of per-GPU memory history kept for the overview's sparklines.
pub const HISTORY_SECS: f64 = 300.0;

/// Where a node's data comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    Daemon {
        url: String,
    },
    /// No daemon answered: NVML is read by the TUI itself, so there is no ingest and no findings.
    InProcess {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Link {
    Connecting,
    Up,
    /// The last fetch failed; the source retries after `retry_in_s` (capped backoff).
    Down {
        error: String,
        since: Timestamp,
        retry_in_s: u64,
        attempt: u32,
    },
}

/// What a source sends about its node.
#[derive(Debug, Clone)]
pub enum Update {
    Snapshot(Box<Snapshot>),
    /// A daemon's answer, with this machine's clock when the request went out and when the
    /// answer was in: the daemon's clock is measured against the midpoint (`Clock`).
    Answer {
        snap: Box<Snapshot>,
        sent: Timestamp,
        received: Timestamp,
    },
    Down {
        error: String,
        ts: Timestamp,
        retry_in_s: u64,
        attempt: u32,
    },
}

#[derive(Debug, Clone)]
pub struct Node {
    /// The daemon's hostname once known, else its URL.
    pub name: String,
    pub origin: Origin,
    pub link: Link,
    /// The latest snapshot; kept while disconnected, shown as stale.
    pub snap: Option<Snapshot>,
    pub findings: Vec<Finding>,
    /// Used memory per GPU UUID, oldest first; `None` marks a gap.
    pub history: BTreeMap<String, VecDeque<(Timestamp, Option<u64>)>>,
    /// How far the daemon's clock is from this machine's, as its answers measure it.
    pub clock: Clock,
}

/// Answers timed against this machine's clock kept for the offset: the newest few.
const CLOCK_SAMPLES: usize = 8;

/// A daemon's clock against this machine's, NTP's way: each answer's `ts` against the midpoint
/// of its request, which is off by at most half the round trip; of the last few answers the one
/// with the shortest round trip is the one believed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Clock {
    /// (round trip, offset) of the newest answers, seconds.
    samples: VecDeque<(f64, f64)>,
}

impl Clock {
    pub fn sample(&mut self, daemon_ts: Timestamp, sent: Timestamp, received: Timestamp) {
        let rtt = (received - sent).max(0.0);
        if !(rtt.is_finite() && daemon_ts.is_finite()) {
            return;
        }
        if self.samples.len() == CLOCK_SAMPLES {
            self.samples.pop_front();
        }
        self.samples
            .push_back((rtt, daemon_ts - (sent + received) / 2.0));
    }

    /// Seconds the daemon's clock is ahead of this one (negative: behind); None before an
    /// answer was timed.
    pub fn offset(&self) -> Option<f64> {
        self.samples
            .iter()
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|s| s.1)
    }
}

impl Node {
    pub fn new(origin: Origin) -> Self {
        let name = match &origin {
            Origin::Daemon { url } => authority(url).to_string(),
            Origin::InProcess { .. } => crate::core::snapshot::hostname(),
        };
        Self {
            name,
            origin,
            link: Link::Connecting,
            snap: None,
            findings: Vec::new(),
            history: BTreeMap::new(),
            clock: Clock::default(),
        }
    }

    /// Takes a snapshot the daemon served: what every view of this node draws from.
    pub fn absorb(&mut self, mut snap: Snapshot) {
        if let (true, Some(old)) = (snap.delta, self.snap.take()) {
            super::merge::delta(old, &mut snap);
        }
        for g in &mut snap.gpus {
            let h = self
                .history
                .entry(g.reading.identity.uuid.clone())
                .or_default();
            let last = h.back().map(|(t, _)| *t).unwrap_or(f64::MIN);
            // A delta without points had no poll since the last answer: nothing to add. A
            // snapshot without history (in-process) adds its own reading.
            if g.history.is_empty() && !snap.delta {
                let used = match g.reading.state {
                    GpuState::Ok => g.reading.memory.map(|m| m.used),
                    _ => None,
                };
                if snap.ts > last {
                    h.push_back((snap.ts, used));
                }
            } else {
                let points = std::mem::take(&mut g.history);
                h.extend(
                    points
                        .into_iter()
                        .filter(|p| p.ts > last)
                        .map(|p| (p.ts, p.value.map(|v| v.used))),
                );
            }
            while h.front().is_some_and(|(t, _)| *t <= snap.ts - HISTORY_SECS) {
                h.pop_front();
            }
        }
        self.history
            .retain(|uuid, _| snap.gpus.iter().any(|g| &g.reading.identity.uuid == uuid));
        self.findings = snap.findings.clone();
        self.name = snap.hostname.clone();
        self.link = Link::Up;
        self.snap = Some(snap);
    }

    pub fn firing(&self) -> usize {
        self.findings.iter().filter(|f| f.firing()).count()
    }

    /// Firing findings about one GPU.
    pub fn firing_on(&self, g: &GpuView) -> usize {
        let idx = g.reading.identity.index;
        self.findings
            .iter()
            .filter(|f| f.firing() && f.gpu_index() == Some(idx))
            .count()
    }

    /// Findings about one trainer (by session, else by pid): firing first, critical before
    /// warning, newest first.
    pub fn findings_for(&self, session: &str, pid: u32) -> Vec<&Finding> {
        let mut v: Vec<&Finding> = self
            .findings
            .iter()
            .filter(|f| f.concerns(Some(session).filter(|s| !s.is_empty()), pid, None))
            .collect();
        v.sort_by(|a, b| {
            (a.state(), !a.critical(), -a.sort_ts())
                .partial_cmp(&(b.state(), !b.critical(), -b.sort_ts()))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        v
    }

    /// The leak finding whose slope the trainer chart draws: pending or firing.
    pub fn active_leak(&self, session: &str, pid: u32) -> Option<&Finding> {
        self.findings_for(session, pid).into_iter().find(|f| {
            f.kind == crate::core::detect::Kind::Leak
                && matches!(f.state(), State::Firing | State::Pending)
        })
    }
}

/// "host:port" of "http://host:port/...".
pub fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    rest.split('/').next().unwrap_or(rest)
}
