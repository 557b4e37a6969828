//! gpumon_aggregator_* families: the aggregator's own health (inputs applied, dropped, waited
//! for, time busy), read through its handle at every scrape.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Handle, UPDATES};
use crate::util::family::{Family, Kind};
use crate::util::health::Health;

fn counter(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Family {
    Family::new(name, help, Kind::Counter, labels)
}

fn load(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

impl Health for Handle {
    fn families(&self, out: &mut String) {
        let s = self.stats();
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
        depth.add(&[], self.queued() as f64);
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
}
