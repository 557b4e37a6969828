//! Alert sinks: firing and resolved findings leave the node as structured log lines (always, from
//! the findings registry), a generic JSON webhook, and Alertmanager's v2 API, so a node without
//! Prometheus still alerts.
//!
//! The aggregator hands each finding transition to this thread on a bounded channel (counting
//! what it cannot take) and never waits on it, so a slow or dead receiver never blocks
//! detection. Each sink keeps the latest state per finding (bounded, counting what it drops),
//! retries with doubling backoff, and Alertmanager also gets every firing finding again each
//! `resend_interval` so it never times an alert out while it fires. A sink that panics is
//! counted and logged, and the thread goes on with the next delivery.

pub mod alertmanager;
mod stats;
pub mod webhook;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::aggregator::{WeakHandle, ALERT_QUEUE};
use crate::core::detect::{Finding, FindingState};
use crate::core::query::{Answer, Query};
use crate::util::backoff::Backoff;
pub use stats::{AlertStats, SinkStats};

/// Findings a sink holds while its receiver is down; past it the oldest states are dropped.
const QUEUE: usize = 10_000;
/// Longest wait between deliveries to a receiver that keeps failing.
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
    stats: Arc<AlertStats>,
    pending: BTreeMap<String, (u64, Finding)>,
    seq: u64,
    backoff: Backoff,
    next_try: Instant,
    failing: bool,
}

impl Queue {
    fn new(sink: Box<dyn Sink>, stats: Arc<AlertStats>) -> Self {
        Self {
            sink,
            stats,
            pending: BTreeMap::new(),
            seq: 0,
            backoff: Backoff::new(Duration::from_secs(1), MAX_BACKOFF),
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
                if let Some(s) = self.stats.sink(self.sink.name()) {
                    s.dropped.fetch_add(1, Ordering::Relaxed);
                }
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
        let started = Instant::now();
        let sent = catch_unwind(AssertUnwindSafe(|| self.sink.send(&batch))).unwrap_or_else(|_| {
            if let Some(s) = self.stats.sink(self.sink.name()) {
                s.panics.fetch_add(1, Ordering::Relaxed);
            }
            tracing::error!(
                sink = self.sink.name(),
                "an alert sink panicked; delivery is retried and the alert thread goes on"
            );
            Err("the sink panicked".into())
        });
        let stats = self.stats.sink(self.sink.name());
        if let Some(s) = stats {
            s.took(started.elapsed());
        }
        match sent {
            Ok(()) => {
                if let Some(s) = stats {
                    s.deliveries.fetch_add(1, Ordering::Relaxed);
                }
                if self.failing {
                    tracing::info!(sink = self.sink.name(), "alert delivery recovered");
                }
                self.pending.clear();
                self.failing = false;
                self.backoff.reset();
            }
            Err(e) => {
                if let Some(s) = stats {
                    s.failures.fetch_add(1, Ordering::Relaxed);
                }
                if !self.failing {
                    tracing::warn!(sink = self.sink.name(), error = %e, pending = batch.len(), "alert delivery failed; retrying with backoff");
                }
                self.failing = true;
                self.next_try = now + self.backoff.fail();
            }
        }
    }
}

/// The alert thread, when any sink is configured: give `transitions` to the aggregator, and
/// `aggregator` once it exists (firing findings are read from it for resends). The thread ends
/// after the aggregator does, once it has delivered the last transitions.
pub struct Alerts {
    /// Taken by the aggregator: when it ends, the alert thread delivers the rest and ends.
    pub transitions: Option<SyncSender<Finding>>,
    pub stats: Arc<AlertStats>,
    pub thread: std::thread::JoinHandle<()>,
    aggregator: SyncSender<WeakHandle>,
}

impl Alerts {
    pub fn attach(&self, aggregator: WeakHandle) {
        let _ = self.aggregator.try_send(aggregator);
    }
}

pub fn spawn(settings: AlertSettings) -> std::io::Result<Option<Alerts>> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(url) = &settings.webhook_url {
        sinks.push(Box::new(webhook::Webhook::new(url, &settings)));
    }
    if let Some(url) = &settings.alertmanager_url {
        sinks.push(Box::new(alertmanager::Alertmanager::new(url, &settings)));
    }
    if sinks.is_empty() {
        return Ok(None);
    }
    Ok(Some(spawn_sinks(sinks, settings.resend_interval)?))
}

/// Starts the alert thread for these sinks.
pub fn spawn_sinks(sinks: Vec<Box<dyn Sink>>, resend: Duration) -> std::io::Result<Alerts> {
    let names: Vec<&'static str> = sinks.iter().map(|s| s.name()).collect();
    let stats = Arc::new(AlertStats::new(&names));
    let queues = sinks
        .into_iter()
        .map(|s| Queue::new(s, stats.clone()))
        .collect();
    let (tx, rx) = std::sync::mpsc::sync_channel(ALERT_QUEUE);
    let (agg_tx, agg_rx) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("gpumon-alerts".into())
        .spawn(move || run(queues, rx, agg_rx, resend))?;
    Ok(Alerts {
        transitions: Some(tx),
        stats,
        thread,
        aggregator: agg_tx,
    })
}

fn run(
    mut queues: Vec<Queue>,
    transitions: Receiver<Finding>,
    aggregator: Receiver<WeakHandle>,
    resend: Duration,
) {
    let mut last_resend = Instant::now();
    let mut agg: Option<WeakHandle> = None;
    loop {
        // Transitions are gathered for up to a second, so a burst goes out as one batch.
        let mut batch = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut ended = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match transitions.recv_timeout(left) {
                Ok(f) => batch.push(f),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    ended = true;
                    break;
                }
            }
        }
        if let Ok(a) = aggregator.try_recv() {
            agg = Some(a);
        }
        let now = Instant::now();
        let resend_due = now.duration_since(last_resend) >= resend;
        let firing: Vec<Finding> = match (&agg, resend_due && !ended) {
            (Some(a), true) => a
                .upgrade()
                .and_then(|h| match h.query_blocking(Query::Firing) {
                    Some(Answer::Firing(f)) => Some(f),
                    _ => None,
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if resend_due {
            last_resend = now;
        }
        for q in &mut queues {
            batch.iter().for_each(|f| q.push(f));
            if q.sink.wants_resend() {
                firing.iter().for_each(|f| q.push(f));
            }
            q.deliver(now);
        }
        if ended {
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
mod oom_tests;
#[cfg(test)]
mod tests;
