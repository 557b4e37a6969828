//! Counters of each alert sink (deliveries, failures, states dropped, time spent), reported as
//! gpumon_alert_* families.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::util::family::{Family, Kind};
use crate::util::health::Health;

fn counter(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Family {
    Family::new(name, help, Kind::Counter, labels)
}

fn load(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
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
}

impl Health for AlertStats {
    fn families(&self, out: &mut String) {
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
