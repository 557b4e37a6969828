//! What a TUI refresh costs the daemon's aggregator and its HTTP worker: the snapshot answer at
//! 8 GPUs x 128 processes with 64 trainers (8 per GPU, joined to their NVML processes), after an
//! hour of polls (GPU history full: 3,600 points) and 400 samples per trainer. Built as a delta
//! since the cursor of the refresh before (one poll and one sample per trainer later), and
//! whole; then written as JSON, as the daemon sends it. Then the TUI's side: the delta parsed
//! and applied. Then jobs (`jobs_*`): the same node with its 64 trainers as 8 jobs of 8 ranks
//! (one `run_id` each, rank = GPU), after 300 polls: the delta again, the trainer families of
//! /metrics as a scrape encodes them, and the snapshot's `jobs` alone. Then the memory split
//! (`categories_*`): the same node with and without a split from every trainer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::core::apply::Core;
use gpumon::core::input::{Input, Lines, Link};
use gpumon::core::model::now;
use gpumon::core::snapshot::Snapshot;
use gpumon::core::store::{Collection, HistoryLimits, NvmlStatus, Store};
use gpumon::core::trainer::Peer;
use gpumon::frontends::tui::app::node::{Node, Origin};
use gpumon::frontends::tui::app::state::{Action, App, Update};
use gpumon::sources::ingest::protocol::parse;
use std::sync::Arc;

const GPUS: u32 = 8;
const TRAINERS_PER_GPU: u32 = 8;
const POLLS: u32 = 3600;
const SAMPLES: u32 = 400;

fn sample(ts: f64, step: u32) -> String {
    let allocated = 21_474_836_480u64 + u64::from(step) * 2_097_152;
    format!(
        concat!(
            r#"{{"type":"sample","ts":{},"step":{},"phase":"train","stats":{{"#,
            r#""allocated_bytes.all.current":{},"allocated_bytes.all.peak":{},"#,
            r#""reserved_bytes.all.current":32212254720,"active_bytes.all.current":{},"#,
            r#""inactive_split_bytes.all.current":268435456,"num_alloc_retries":0,"num_ooms":0}},"#,
            r#""device_free":47244640256,"device_total":85520809984}}"#
        ),
        ts,
        step,
        allocated,
        allocated + 8_589_934_592,
        allocated
    )
}

/// One poll at `ts`, the GPUs' memory moving as a training run's does.
fn poll(store: &mut Store, ts: f64, i: u32) {
    let mut reading = common::node(GPUS, 128);
    reading.ts = ts;
    for g in &mut reading.gpus {
        if let Some(m) = g.memory.as_mut() {
            m.used += u64::from(i % 600) * 4_194_304;
            m.free -= u64::from(i % 600) * 4_194_304;
        }
        g.utilization = Some(0.5 + f64::from(i % 50) / 100.0);
    }
    store.apply(reading, 0.001);
}

/// A poll at `ts` through the aggregator, as the daemon's poller hands it over.
fn collect(core: &mut Core, ts: f64) {
    let mut reading = common::node(GPUS, 128);
    reading.ts = ts;
    let status = NvmlStatus {
        up: true,
        last_poll_ts: Some(ts),
        ..NvmlStatus::default()
    };
    core.apply(Input::Collection(Box::new(Collection {
        ts,
        reading: Ok(Arc::new(reading)),
        status,
        text: "".into(),
    })));
}

fn bench(c: &mut Criterion) {
    let t0 = now() - f64::from(POLLS);
    let mut store = Store::new(HistoryLimits { gpu_points: 3600 }, 1.0, "lib".into());
    for i in 0..POLLS {
        poll(&mut store, t0 + f64::from(i), i);
    }
    let mut core = Core::new(store);
    let mut conns: Vec<Link> = Vec::new();
    for g in 0..GPUS {
        for k in 0..TRAINERS_PER_GPU {
            let pid = 100_000 + g * 1000 + k;
            let mut conn = Link::new(Peer {
                pid,
                uid: 1000,
                gid: 1000,
            });
            let hello = format!(
                r#"{{"type":"hello","v":1,"pid":{pid},"job":"llama-ft","rank":{k},"world_size":64,"cuda_device":{g},"gpu_uuid":"GPU-{g:08x}-1111-2222-3333-444444444444","client":"gpumon-py/0.1.0","torch":"2.5.1"}}"#
            );
            send(&mut core, &mut conn, hello.as_bytes(), t0);
            conns.push(conn);
        }
    }
    let last = t0 + f64::from(POLLS);
    for s in 0..SAMPLES {
        let ts = last - f64::from(SAMPLES - s);
        for conn in &mut conns {
            send(&mut core, conn, sample(ts, s).as_bytes(), ts);
        }
    }
    let first = Snapshot::build_since(core.store(), "node", 300.0, Some(""));
    let cursor = first.cursor.clone().unwrap();
    // The refresh after that cursor's: a poll, and a sample from each trainer.
    collect(&mut core, last);
    for conn in &mut conns {
        send(&mut core, conn, sample(last, SAMPLES).as_bytes(), last);
    }
    let delta = Snapshot::build_since(core.store(), "node", 300.0, Some(&cursor));
    assert!(delta.delta);
    assert_eq!(delta.sessions.len(), 64);
    assert!(delta.sessions.iter().all(|s| s.series.len() == 1));
    assert!(delta.gpus.iter().all(|g| g.history.len() == 1));
    c.bench_function("snapshot_delta_build_8gpu_128proc_64trainers", |b| {
        b.iter(|| Snapshot::build_since(core.store(), "node", 300.0, Some(&cursor)))
    });
    // Written as the daemon writes it (with glibc's mmap threshold fixed as the daemon fixes
    // it): into a buffer made the size of the last answer, and, for comparison, one grown from
    // empty.
    gpumon::malloc::return_large_buffers();
    let size = serde_json::to_vec(&delta).unwrap().len();
    c.bench_function("snapshot_delta_json_8gpu_128proc_64trainers", |b| {
        b.iter(|| {
            let mut body = Vec::with_capacity(size + size / 16);
            serde_json::to_writer(&mut body, &delta).unwrap();
            body
        })
    });
    c.bench_function("snapshot_delta_json_grown_8gpu_128proc_64trainers", |b| {
        b.iter(|| serde_json::to_vec(&delta).unwrap())
    });
    c.bench_function("snapshot_whole_build_8gpu_128proc_64trainers", |b| {
        b.iter(|| Snapshot::build_since(core.store(), "node", 300.0, None))
    });
    tui(c, first, &delta);
}

/// The TUI's side of the same refresh: the delta parsed as its fetch thread parses it, then
/// applied on its main thread to the state the answer before left (merged, findings, rows
/// rebuilt and sorted). Drawing is `tui_render`'s.
fn tui(c: &mut Criterion, first: Snapshot, delta: &Snapshot) {
    let body = serde_json::to_vec(delta).unwrap();
    c.bench_function("tui_delta_parse_8gpu_128proc_64trainers", |b| {
        b.iter(|| serde_json::from_slice::<Snapshot>(&body).unwrap())
    });
    let node = Node::new(Origin::Daemon {
        url: "http://127.0.0.1:9477".into(),
    });
    let mut app = App::new(vec![node], false);
    app.update(Action::Resize {
        width: 160,
        height: 48,
    });
    app.update(Action::Data {
        node: 0,
        update: Update::Snapshot(Box::new(first)),
    });
    assert_eq!(app.procs.rows.len(), (GPUS * 128) as usize);
    c.bench_function("tui_delta_apply_8gpu_128proc_64trainers", |b| {
        b.iter_batched(
            || (app.clone(), delta.clone()),
            |(mut app, delta)| {
                app.update(Action::Data {
                    node: 0,
                    update: Update::Snapshot(Box::new(delta)),
                });
                app
            },
            criterion::BatchSize::LargeInput,
        );
    });
}

/// The trainers of `jobs`: session (g, k) is rank g of the run `llama-ft-{k}`, 8 ranks each.
fn job_hello(g: u32, k: u32, pid: u32) -> String {
    format!(
        r#"{{"type":"hello","v":1,"pid":{pid},"job":"llama-ft","run_id":"llama-ft-{k}","rank":{g},"world_size":8,"cuda_device":{g},"gpu_uuid":"GPU-{g:08x}-1111-2222-3333-444444444444","client":"gpumon-py/0.1.0","torch":"2.5.1"}}"#
    )
}

/// A node at 8x128 after `POLLS_J` polls whose 64 trainers said `hello(g, k, pid)` and sent
/// `SAMPLES` samples, the one at step 3 carrying `split` as its `categories` when given; with
/// the cursor of a refresh one poll and one sample per trainer ago.
fn node_of(hello: impl Fn(u32, u32, u32) -> String, split: Option<&str>) -> (Core, String) {
    const POLLS_J: u32 = 300;
    let t0 = now() - f64::from(POLLS_J);
    let mut store = Store::new(HistoryLimits { gpu_points: 3600 }, 1.0, "lib".into());
    for i in 0..POLLS_J {
        poll(&mut store, t0 + f64::from(i), i);
    }
    let mut core = Core::new(store);
    let mut conns: Vec<Link> = Vec::new();
    for g in 0..GPUS {
        for k in 0..TRAINERS_PER_GPU {
            let pid = 100_000 + g * 1000 + k;
            let mut conn = Link::new(Peer {
                pid,
                uid: 1000,
                gid: 1000,
            });
            send(&mut core, &mut conn, hello(g, k, pid).as_bytes(), t0);
            conns.push(conn);
        }
    }
    let last = t0 + f64::from(POLLS_J);
    for s in 0..SAMPLES {
        let ts = last - f64::from(SAMPLES - s);
        let mut line = sample(ts, s);
        if let (3, Some(split)) = (s, split) {
            line.truncate(line.len() - 1);
            line.push_str(&format!(r#","categories":{split}}}"#));
        }
        for conn in &mut conns {
            send(&mut core, conn, line.as_bytes(), ts);
        }
    }
    let first = Snapshot::build_since(core.store(), "node", 300.0, Some(""));
    let cursor = first.cursor.clone().unwrap();
    collect(&mut core, last);
    for conn in &mut conns {
        send(&mut core, conn, sample(last, SAMPLES).as_bytes(), last);
    }
    let delta = Snapshot::build_since(core.store(), "node", 300.0, Some(&cursor));
    assert!(delta.delta);
    assert_eq!(delta.sessions.len(), 64);
    (core, cursor)
}

/// What jobs cost per snapshot and per /metrics encode, at 8x128 with 8 jobs of 8 ranks. A
/// daemon without jobs reads the same hellos (it ignores `run_id`), so the first two compare
/// across builds; `jobs_views` is the verdict alone.
fn jobs(c: &mut Criterion) {
    let (core, cursor) = node_of(job_hello, None);
    c.bench_function("jobs_snapshot_delta_build_8gpu_128proc_8jobs_of_8", |b| {
        b.iter(|| Snapshot::build_since(core.store(), "node", 300.0, Some(&cursor)))
    });
    c.bench_function("jobs_metrics_trainer_text_8gpu_128proc_8jobs_of_8", |b| {
        b.iter(|| gpumon::outputs::prometheus::trainer_text(core.store()))
    });
    // The verdict alone (a build without jobs has none to measure).
    let views = gpumon::core::snapshot::jobs::views(core.store(), "node");
    assert_eq!(views.len(), 8);
    assert!(views.iter().all(|v| v.members.len() == 8));
    c.bench_function("jobs_views_8gpu_128proc_8jobs_of_8", |b| {
        b.iter(|| gpumon::core::snapshot::jobs::views(core.store(), "node"))
    });
}

/// A split as a real client sends it: FSDP-style partial reason included.
const SPLIT: &str = r#"{"step":3,"parameters_bytes":4294967296,"gradients_bytes":4294967296,"optimizer_state_bytes":8589934592,"buffers_bytes":1048576,"activations_bytes":6442450944,"batch_size":16,"fp32_bytes":8589934592,"partial":["dtensor_local: 96 parameters are DTensor shards: local sizes counted"]}"#;

/// What the split costs: the same node with and without every trainer having sent one (each
/// answer then carries 64 splits and fits 64 batches), the snapshot delta and the metrics.
fn categories(c: &mut Criterion) {
    for (name, split) in [("without", None), ("with", Some(SPLIT))] {
        let (core, cursor) = node_of(job_hello, split);
        let one = Snapshot::build_since(core.store(), "node", 300.0, Some(&cursor));
        assert_eq!(
            one.sessions
                .iter()
                .filter(|s| s.categories.is_some())
                .count(),
            if split.is_some() { 64 } else { 0 }
        );
        c.bench_function(
            &format!("categories_{name}_snapshot_delta_build_8gpu_128proc_64trainers"),
            |b| b.iter(|| Snapshot::build_since(core.store(), "node", 300.0, Some(&cursor))),
        );
        c.bench_function(
            &format!("categories_{name}_metrics_trainer_text_8gpu_128proc_64trainers"),
            |b| b.iter(|| gpumon::outputs::prometheus::trainer_text(core.store())),
        );
    }
}

criterion_group!(benches, bench, jobs, categories);
criterion_main!(benches);

/// One line applied to `core` on the connection `link`, as ingest hands the core a batch of
/// parsed lines.
fn send(core: &mut Core, link: &mut Link, raw: &[u8], now: f64) {
    let mut batch = Box::new(Lines::new(*link));
    batch.messages.push(parse(raw).unwrap());
    batch.now = now;
    if let Some(done) = core.apply(Input::Lines(batch)).into_lines() {
        *link = done.link;
    }
}
