//! Alert sinks: firing and resolved findings leave the node as structured log lines (always, from
//! the findings registry), a generic JSON webhook, and Alertmanager's v2 API, so a node without
//! Prometheus still alerts.
//!
//! Detection only appends to the registry's bounded outbox; this thread drains it once a second
//! and delivers, so a slow or dead receiver never blocks detection. Each sink keeps the latest
//! state per finding (bounded), retries with doubling backoff, and Alertmanager also gets every
//! firing finding again each `resend_interval` so it never times an alert out while it fires.

pub mod alertmanager;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::detect::{Finding, FindingState};
use crate::store::SharedStore;

/// Findings a sink holds while its receiver is down; past it the oldest states are dropped.
const QUEUE: usize = 10_000;
const MAX_BACKOFF: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertSettings {
    pub webhook_url: Option<String>,
    pub alertmanager_url: Option<String>,
    pub resend_interval: Duration,
    /// Labels alerts with the node they come from.
    pub hostname: String,
    /// Where a person can look at the finding (the daemon's API).
    pub api_url: String,
}

/// A receiver of batches of findings.
pub trait Sink: Send {
    fn name(&self) -> &'static str;
    /// Alertmanager needs firing alerts repeated; a webhook wants transitions only.
    fn wants_resend(&self) -> bool;
    fn send(&self, batch: &[Finding]) -> Result<(), String>;
}

struct Queue {
    sink: Box<dyn Sink>,
    pending: BTreeMap<String, (u64, Finding)>,
    seq: u64,
    backoff: Duration,
    next_try: Instant,
    failing: bool,
}

impl Queue {
    fn new(sink: Box<dyn Sink>) -> Self {
        Self {
            sink,
            pending: BTreeMap::new(),
            seq: 0,
            backoff: Duration::from_secs(1),
            next_try: Instant::now(),
            failing: false,
        }
    }

    fn push(&mut self, f: &Finding) {
        if f.state == FindingState::Pending {
            return;
        }
        self.seq += 1;
        self.pending.insert(f.id.clone(), (self.seq, f.clone()));
        if self.pending.len() > QUEUE {
            // Oldest update first: a receiver down for long loses the stalest states.
            if let Some(id) = self
                .pending
                .iter()
                .min_by_key(|(_, (seq, _))| *seq)
                .map(|(id, _)| id.clone())
            {
                self.pending.remove(&id);
            }
        }
    }

    fn deliver(&mut self, now: Instant) {
        if self.pending.is_empty() || now < self.next_try {
            return;
        }
        let mut batch: Vec<(u64, Finding)> = self.pending.values().cloned().collect();
        batch.sort_by_key(|(seq, _)| *seq);
        let batch: Vec<Finding> = batch.into_iter().map(|(_, f)| f).collect();
        match self.sink.send(&batch) {
            Ok(()) => {
                if self.failing {
                    tracing::info!(sink = self.sink.name(), "alert delivery recovered");
                }
                self.pending.clear();
                self.failing = false;
                self.backoff = Duration::from_secs(1);
            }
            Err(e) => {
                if !self.failing {
                    tracing::warn!(sink = self.sink.name(), error = %e, pending = batch.len(), "alert delivery failed; retrying with backoff");
                }
                self.failing = true;
                self.next_try = now + self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Starts the alert thread when any sink is configured; it stops when `stop` is dropped.
pub fn spawn(
    settings: AlertSettings,
    store: SharedStore,
    stop: Receiver<()>,
) -> std::io::Result<Option<std::thread::JoinHandle<()>>> {
    let mut queues = Vec::new();
    if let Some(url) = &settings.webhook_url {
        queues.push(Queue::new(Box::new(webhook::Webhook::new(url, &settings))));
    }
    if let Some(url) = &settings.alertmanager_url {
        queues.push(Queue::new(Box::new(alertmanager::Alertmanager::new(
            url, &settings,
        ))));
    }
    if queues.is_empty() {
        return Ok(None);
    }
    let resend = settings.resend_interval;
    std::thread::Builder::new()
        .name("gpumon-alerts".into())
        .spawn(move || run(queues, store, resend, stop))
        .map(Some)
}

fn run(mut queues: Vec<Queue>, store: SharedStore, resend: Duration, stop: Receiver<()>) {
    let mut last_resend = Instant::now();
    loop {
        let stopping = !matches!(
            stop.recv_timeout(Duration::from_secs(1)),
            Err(RecvTimeoutError::Timeout)
        );
        let now = Instant::now();
        let resend_due = now.duration_since(last_resend) >= resend;
        let (transitions, firing) = match store.write() {
            Ok(mut s) => {
                let mut t = s.sessions.findings.drain();
                let mut firing: Vec<Finding> = if resend_due {
                    s.sessions.firing().cloned().collect()
                } else {
                    Vec::new()
                };
                // The GPU's NVML index, for the `gpu` label, from the latest collection.
                for f in t.iter_mut().chain(firing.iter_mut()) {
                    f.gpu = f.subject.gpu_uuid.as_deref().and_then(|u| s.gpu_index(u));
                }
                (t, firing)
            }
            Err(_) => return,
        };
        if resend_due {
            last_resend = now;
        }
        for q in &mut queues {
            transitions.iter().for_each(|f| q.push(f));
            if q.sink.wants_resend() {
                firing.iter().for_each(|f| q.push(f));
            }
            q.deliver(now);
        }
        if stopping {
            return;
        }
    }
}

/// RFC 3339 time for a Unix timestamp.
pub fn rfc3339(ts: f64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_secs_f64(ts.max(0.0));
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests;
