//! /metrics rendering at 8 GPUs x 128 processes, from a store filled with synthetic readings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::core::model::*;
use gpumon::core::store::{HistoryLimits, Store};
use std::sync::Arc;

use gpumon::outputs::prometheus::{gpu_text, Exporter};
use gpumon::outputs::record::RecordStats;
use gpumon::sources::ingest::stats::IngestStats;
use gpumon::util::health::Health;

pub fn node(gpus: u32, procs_per_gpu: u32) -> NodeReading {
    let gpus_v = (0..gpus)
        .map(|index| GpuReading {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-{index:08x}-1111-2222-3333-444444444444"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x17 + index),
            },
            state: GpuState::Ok,
            error: None,
            memory: Some(MemoryInfo {
                total: 85_520_809_984,
                used: 40_000_000_000,
                free: 44_953_530_368,
                reserved: 567_279_616,
            }),
            utilization: Some(0.87),
            temperature_celsius: Some(61.0),
            power_watts: Some(512.3),
            mig_mode: false,
            mig_devices: vec![],
        })
        .collect();
    let processes = (0..gpus)
        .flat_map(|g| {
            (0..procs_per_gpu).map(move |i| ProcessReading {
                gpu: g,
                uuid: format!("GPU-{g:08x}-1111-2222-3333-444444444444").into(),
                pid: 100_000 + g * 1000 + i,
                kind: ProcessKind::Compute,
                used_memory_bytes: Some(300_000_000 + i as u64),
                mig_uuid: None,
                gpu_instance_id: None,
                compute_instance_id: None,
                info: ProcInfo {
                    name: Some("python3".into()),
                    user: Some("trainer".into()),
                    uid: Some(1000),
                    container: Some("3f4e1b2c9d8a".into()),
                    cgroup: None,
                    ..ProcInfo::default()
                }
                .into(),
            })
        })
        .collect();
    NodeReading {
        ts: 1.0,
        driver_version: Some("550.54.15".into()),
        gpus: gpus_v,
        processes,
    }
}

fn bench(c: &mut Criterion) {
    let mut store = Store::new(HistoryLimits { gpu_points: 3600 }, 1.0, "lib".into());
    store.apply(node(8, 128), 0.001);
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
