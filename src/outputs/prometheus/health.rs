//! Health of the daemon's own parts, node_exporter style: the aggregator (inputs applied,
//! dropped, waited for, time busy) and each alert sink (deliveries, failures, states dropped,
//! time spent).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::proto::MetricType;

use super::Family;
use crate::core::aggregator::{Handle, UPDATES};

fn counter(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Family {
    Family::new(name, help, MetricType::COUNTER, labels)
}

fn load(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

pub fn aggregator_families(h: &Handle, out: &mut String) {
    let s = h.stats();
    let mut inputs = counter(
        "gpumon_aggregator_inputs_total",
        "Inputs the aggregator applied, by kind: collection (an NVML poll), ingest (a batch of trainer lines), close (a trainer connection ending), read (an API read of the store), other.",
        &["input"],
    );
    inputs.add(&["collection"], load(&s.collections));
    for (i, kind) in UPDATES.iter().enumerate() {
        inputs.add(&[kind], load(&s.updates[i]));
    }
    inputs.add(&["read"], load(&s.reads));
    inputs.finish(out);
    let mut dropped = counter(
        "gpumon_aggregator_dropped_total",
        "Inputs dropped because the aggregator's queue was full, by kind (collection: the next poll replaces it; alert: a finding transition the alert thread could not take; outbox: transitions one input raised past the findings' outbox before they were forwarded).",
        &["input"],
    );
    dropped.add(&["collection"], load(&s.collections_dropped));
    dropped.add(&["alert"], load(&s.alerts_dropped));
    dropped.add(&["outbox"], load(&s.outbox_dropped));
    dropped.finish(out);
    let mut full = counter(
        "gpumon_aggregator_queue_full_total",
        "Sends that found the aggregator's queue full and waited for room (trainer batches and API reads; nothing is lost).",
        &[],
    );
    full.add(&[], load(&s.queue_full));
    full.finish(out);
    let mut depth = Family::gauge(
        "gpumon_aggregator_queue_depth",
        "Inputs waiting for the aggregator now.",
        &[],
    );
    depth.add(&[], h.queued() as f64);
    depth.finish(out);
    let mut busy = counter(
        "gpumon_aggregator_busy_seconds_total",
        "Time the aggregator spent applying inputs and publishing views; its rate is the share of a core it uses.",
        &[],
    );
    busy.add(&[], load(&s.busy_ns) / 1e9);
    busy.finish(out);
    let mut views = counter(
        "gpumon_aggregator_views_total",
        "Views the aggregator published (at most one per 10 ms while inputs keep coming).",
        &[],
    );
    views.add(&[], load(&s.views));
    views.finish(out);
    let mut panics = counter(
        "gpumon_aggregator_panics_total",
        "Inputs that panicked in the aggregator; each was dropped and the aggregator went on (a bug: please report it).",
        &[],
    );
    panics.add(&[], load(&s.panics));
    panics.finish(out);
}

/// Counters of one alert sink.
#[derive(Debug, Default)]
pub struct SinkStats {
    pub deliveries: AtomicU64,
    pub failures: AtomicU64,
    /// Finding states dropped because the sink's queue was full (its receiver down for long).
    pub dropped: AtomicU64,
    pub panics: AtomicU64,
    /// Time spent in deliveries, failed ones included, and in the last one, in nanoseconds.
    pub busy_ns: AtomicU64,
    pub last_ns: AtomicU64,
}

impl SinkStats {
    /// Counts one delivery attempt's time.
    pub fn took(&self, d: std::time::Duration) {
        let ns = d.as_nanos() as u64;
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        self.last_ns.store(ns, Ordering::Relaxed);
    }
}

/// Per-sink counters, in the order the sinks were configured.
#[derive(Debug, Default)]
pub struct AlertStats {
    pub sinks: Vec<(&'static str, SinkStats)>,
}

impl AlertStats {
    pub fn new(names: &[&'static str]) -> Self {
        Self {
            sinks: names.iter().map(|n| (*n, SinkStats::default())).collect(),
        }
    }

    pub fn sink(&self, name: &str) -> Option<&SinkStats> {
        self.sinks.iter().find(|(n, _)| *n == name).map(|(_, s)| s)
    }

    pub fn families(&self, out: &mut String) {
        let mut ok = counter(
            "gpumon_alert_deliveries_total",
            "Batches of findings an alert sink delivered, by sink and result (ok, error).",
            &["sink", "result"],
        );
        let mut dropped = counter(
            "gpumon_alert_dropped_total",
            "Finding states an alert sink dropped because its queue was full (its receiver down for long), by sink.",
            &["sink"],
        );
        let mut panics = counter(
            "gpumon_alert_panics_total",
            "Deliveries that panicked in an alert sink, by sink; the alert thread went on.",
            &["sink"],
        );
        let mut busy = counter(
            "gpumon_alert_delivery_seconds_total",
            "Time an alert sink spent delivering (failed attempts included), by sink; over gpumon_alert_deliveries_total it is the mean delivery time.",
            &["sink"],
        );
        let mut last = Family::gauge(
            "gpumon_alert_last_delivery_duration_seconds",
            "How long an alert sink's last delivery attempt took, by sink (a receiver timing out shows here first).",
            &["sink"],
        );
        for (name, s) in &self.sinks {
            ok.add(&[name, "ok"], load(&s.deliveries));
            ok.add(&[name, "error"], load(&s.failures));
            dropped.add(&[name], load(&s.dropped));
            panics.add(&[name], load(&s.panics));
            busy.add(&[name], load(&s.busy_ns) / 1e9);
            last.add(&[name], load(&s.last_ns) / 1e9);
        }
        for f in [ok, dropped, panics, busy, last] {
            f.finish(out);
        }
    }
}
