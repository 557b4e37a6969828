//! /metrics rendering at 8 GPUs x 128 processes, from a store filled with synthetic readings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::core::store::{HistoryLimits, Store};
use std::sync::Arc;

use gpumon::outputs::prometheus::{gpu_text, Exporter};
use gpumon::outputs::record::RecordStats;
use gpumon::sources::ingest::stats::IngestStats;
use gpumon::util::health::Health;

fn bench(c: &mut Criterion) {
    let mut store = Store::new(HistoryLimits { gpu_points: 3600 }, 1.0, "lib".into());
    store.apply(common::node(8, 128), 0.001);
    // What the first scrape after each collection pays (once per poll interval).
    c.bench_function("encode_after_collection_8gpu_x_128proc", |b| {
        b.iter(|| gpu_text(&store.nvml, store.latest()))
    });
    // The ingest and record counters a daemon's scrape always carries.
    let health: Vec<Arc<dyn Health + Send + Sync>> = vec![
        Arc::new(IngestStats::default()),
        Arc::new(RecordStats::new()),
    ];
    let exporter = Exporter::of_store(&store, health).unwrap();
    let text = exporter.render();
    assert!(text.lines().count() > 2 * 8 * 128);
    // What every other scrape pays.
    c.bench_function("render_metrics_8gpu_x_128proc", |b| {
        b.iter(|| exporter.render())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
