//! Deterministic TUI states for the snapshot tests and the render benchmark, built from
//! synthetic snapshots fed through `App::update` exactly as the sources would (no daemon).
// Test support only (cfg(test) or the `fixtures` feature): a broken fixture fails loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod attribution;
mod categories;
mod crowded;
mod demo;
mod jobs;
mod nodes;
mod oom;
mod peak;

pub use attribution::{asking_leak, eval_graph_leak, kept_outputs_leak, unavailable_leak};
pub use categories::{
    fitted_split, partial_split, proportional_split, split_fitted, split_partial,
    split_proportional,
};
pub use crowded::{crowded, hundred_processes, largest};
pub use demo::demo_like;
pub use jobs::{failed_job, leaking_job, two_node_job};
pub use nodes::{disconnected, in_process, multi_node};
pub use oom::{explained_fragmentation, explained_leak, survived_pressure};
pub use peak::near_limit_peak;
use serde_json::{json, Value};

use crate::core::model::*;
use crate::core::snapshot::{GpuView, IngestView, NvmlView, SessionView, Snapshot};
use crate::core::store::{GpuPoint, HistoryLimits, Point, Store};
use crate::core::trainer::Stats;
use crate::core::trainer::{EventRecord, SessionPoint};
use crate::frontends::tui::app::state::{Action, App, Node, Origin, Update};

/// "Now" in every fixture.
pub const NOW: f64 = 1_763_700_300.0;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const H100_TOTAL: u64 = 85_520_809_984;
const H100_RESERVED: u64 = 567_279_616;

/// An H100 with `used` bytes in use and five minutes of history that wanders below it.
pub fn gpu(index: u32, used: u64) -> GpuView {
    let history = (0..300u64)
        .map(|i| {
            let wave = (i % 60).min(60 - i % 60) * 96 * MIB;
            let v = used.saturating_sub(4 * GIB) + wave + i * 8 * MIB;
            Point {
                ts: NOW - 299.0 + i as f64,
                value: Some(GpuPoint {
                    used: v.min(used),
                    reserved: H100_RESERVED,
                    free: H100_TOTAL - H100_RESERVED - v.min(used),
                    utilization: Some(0.5),
                }),
            }
        })
        .collect();
    GpuView {
        reading: GpuReading {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-{index:08x}-2222-3333-4444-555555555555"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x17 + index),
            },
            state: GpuState::Ok,
            error: None,
            memory: Some(MemoryInfo {
                total: H100_TOTAL,
                used,
                free: H100_TOTAL - H100_RESERVED - used,
                reserved: H100_RESERVED,
            }),
            utilization: Some(0.37 + 0.07 * f64::from(index % 8)),
            temperature_celsius: Some(41.0 + 3.0 * f64::from(index % 8)),
            power_watts: Some(120.0 + 60.0 * f64::from(index % 8)),
            mig_mode: false,
            mig_devices: vec![],
            unified: None,
        },
        history,
    }
}

pub fn process(gpu: u32, pid: u32, name: &str, user: &str, used: u64) -> ProcessReading {
    ProcessReading {
        gpu,
        uuid: format!("GPU-{gpu:08x}-2222-3333-4444-555555555555").into(),
        pid,
        kind: if name == "Xorg" {
            ProcessKind::Graphics
        } else {
            ProcessKind::Compute
        },
        used_memory_bytes: Some(used),
        mig_uuid: None,
        gpu_instance_id: None,
        compute_instance_id: None,
        info: ProcInfo {
            name: Some(name.into()),
            user: Some(user.into()),
            uid: Some(1000),
            container: (name != "Xorg")
                .then(|| format!("{:012x}", 0x3f4e_1b2c_9d8a_u64 + u64::from(pid))),
            cgroup: None,
            ..ProcInfo::default()
        }
        .into(),
    }
}

/// A trainer session (job, rank) with one step-boundary sample per step in `steps`, whose
/// floor at step s is `floor(s)`; peak and reserved ride above it.
pub fn trainer(
    id: &str,
    pid: u32,
    gpu: u32,
    (job, rank): (&str, u64),
    steps: std::ops::RangeInclusive<u64>,
    floor: impl Fn(u64) -> u64,
) -> SessionView {
    let (first, last) = (*steps.start(), *steps.end());
    let steps = last + 1 - first;
    let series: Vec<Point<SessionPoint>> = (first..=last)
        .map(|s| {
            let a = floor(s);
            Point {
                ts: NOW - (last - s) as f64 * 0.5,
                value: Some(SessionPoint {
                    step: Some(s),
                    train: true,
                    allocated: Some(a),
                    allocated_peak: Some(a + 6 * GIB),
                    reserved: Some(a + 8 * GIB),
                }),
            }
        })
        .collect();
    let a = floor(last);
    SessionView {
        session: id.into(),
        pid,
        ns_pid: Some(17),
        uid: 1000,
        job: Some(job.into()),
        rank: Some(rank),
        world_size: Some(8),
        gpu_uuid: Some(format!("GPU-{gpu:08x}-2222-3333-4444-555555555555")),
        gpu: Some(gpu),
        nvml: None,
        ledger: None,
        torch: Some("2.5.1".into()),
        client: Some("gpumon-client/0.1.0".into()),
        started: NOW - 600.0,
        samples: steps,
        last_sample_ts: Some(NOW),
        step: Some(last),
        phase: Some("train".into()),
        stats: Some(Stats {
            allocated: Some(a),
            allocated_peak: Some(a + 6 * GIB),
            reserved: Some(a + 8 * GIB),
            alloc_retries: Some(0),
            ooms: Some(0),
            ..Stats::default()
        }),
        device_free: Some(H100_TOTAL - a - 8 * GIB - H100_RESERVED),
        device_total: Some(H100_TOTAL),
        alloc_limit: None,
        alloc_retries_total: 0,
        ooms_total: 0,
        ended: None,
        events: vec![],
        series,
        attribution: None,
        armed: None,
        batch_fit: None,
        categories: None,
        largest_safe_batch: None,
    }
}

pub fn snapshot(
    host: &str,
    gpus: Vec<GpuView>,
    processes: Vec<ProcessReading>,
    sessions: Vec<SessionView>,
    findings: Vec<Value>,
) -> Snapshot {
    // Built on an empty store's snapshot, so fields added to Snapshot later keep their defaults;
    // findings go through serde, so they fit whatever type the snapshot holds them as.
    let empty = Store::new(HistoryLimits { gpu_points: 1 }, 1.0, String::new());
    let mut s = Snapshot::build(&empty, host, 0.0);
    s.version = "0.1.0".into();
    s.ts = NOW;
    s.nvml = NvmlView {
        up: true,
        error: None,
        library: "libnvidia-ml.so.1".into(),
        driver_version: Some("550.54.15".into()),
        last_poll_ts: Some(NOW),
        last_poll_duration_seconds: 0.002,
        simulated: None,
    };
    s.gpus = gpus;
    // The daemon joins each process to its live session; these made-up nodes join on pid and GPU.
    s.processes = processes
        .into_iter()
        .map(|reading| {
            let joined = sessions.iter().find(|x| {
                x.ended.is_none() && x.pid == reading.pid && x.gpu.is_none_or(|g| g == reading.gpu)
            });
            crate::core::snapshot::ProcessView {
                session: joined.map(|x| x.session.clone()),
                ns_pid: joined.and_then(|x| x.ns_pid),
                orphaned: false,
                reading,
            }
        })
        .collect();
    // And each live session's ledger from its process's NVML figure, as the daemon makes it.
    let mut sessions = sessions;
    for x in sessions
        .iter_mut()
        .filter(|x| x.ended.is_none() && x.ledger.is_none())
    {
        let used = s
            .processes
            .iter()
            .find(|p| p.session.as_deref() == Some(x.session.as_str()))
            .and_then(|p| p.used_memory_bytes);
        x.ledger = Some(crate::core::ledger::ledger(&crate::core::ledger::Inputs {
            nvml_used: used,
            poll_ts: Some(NOW),
            stats: x.stats.as_ref(),
            sample_ts: x.last_sample_ts,
            sessions_sharing: 1,
        }));
    }
    s.sessions = sessions;
    // A fixture that does not read as the daemon's findings is a broken test, not an empty screen.
    s.findings = serde_json::from_value(Value::Array(findings)).unwrap();
    s.ingest = Some(IngestView {
        connections: 2,
        lines: 18_342,
        rejected: 0,
        dropped: 0,
    });
    s
}

/// A state with one node per (origin, updates), each update applied as an action.
pub fn app(nodes: Vec<(Origin, Vec<Update>)>) -> App {
    let mut updates = Vec::new();
    let nodes = nodes
        .into_iter()
        .enumerate()
        .map(|(i, (origin, u))| {
            updates.extend(u.into_iter().map(|u| (i, u)));
            Node::new(origin)
        })
        .collect();
    let mut app = App::new(nodes, true);
    for (node, update) in updates {
        app.update(Action::Data { node, update });
    }
    app
}

fn daemon(url: &str) -> Origin {
    Origin::Daemon { url: url.into() }
}

fn snap(s: Snapshot) -> Update {
    Update::Snapshot(Box::new(s))
}

fn node_processes() -> Vec<ProcessReading> {
    vec![
        process(0, 4242, "python", "alice", 31 * GIB),
        process(0, 4243, "torchrun", "bob", 20 * GIB),
        process(1, 5000, "python", "carol", 40 * GIB),
        process(1, 5001, "Xorg", "root", 16 * MIB),
    ]
}

fn bert() -> SessionView {
    trainer("s-1", 4243, 0, ("bert-base", 0), 5_101..=5_400, |_| {
        12 * GIB
    })
}

/// Two busy GPUs, four processes, one healthy trainer.
pub fn healthy() -> App {
    let s = snapshot(
        "gpu-node-1",
        vec![gpu(0, 51 * GIB), gpu(1, 40 * GIB + 272 * MIB)],
        node_processes(),
        vec![bert()],
        vec![],
    );
    app(vec![(daemon("http://127.0.0.1:9477"), vec![snap(s)])])
}

pub fn no_gpus() -> App {
    let s = snapshot("cpu-node", vec![], vec![], vec![], vec![]);
    app(vec![(daemon("http://127.0.0.1:9477"), vec![snap(s)])])
}

pub fn nvml_down() -> App {
    let mut s = snapshot("gpu-node-1", vec![], vec![], vec![], vec![]);
    s.nvml.up = false;
    s.nvml.driver_version = None;
    s.nvml.error = Some(
        "cannot load the NVML library \"libnvidia-ml.so.1\": libnvidia-ml.so.1: cannot open shared object file: No such file or directory. Install the NVIDIA driver, or point --nvml-lib (GPUMON_NVML_LIB) at libnvidia-ml.so.1".into(),
    );
    app(vec![(daemon("http://127.0.0.1:9477"), vec![snap(s)])])
}

/// The leaking trainer: floor flat until step 610, then +2 MiB per step, up to step 900.
pub fn leaking() -> SessionView {
    let mut s = trainer("s-3", 4242, 0, ("llama-ft", 0), 601..=900, |step| {
        9 * GIB + step.saturating_sub(610) * 2 * MIB
    });
    s.events = vec![
        EventRecord {
            ts: NOW - 240.0,
            kind: "phase".into(),
            detail: Some("eval".into()),
            alloc_bytes: None,
            device_free: None,
            alloc_limit: None,
        },
        EventRecord {
            ts: NOW - 90.0,
            kind: "checkpoint".into(),
            detail: Some("/ckpt/step-800.pt".into()),
            alloc_bytes: None,
            device_free: None,
            alloc_limit: None,
        },
    ];
    s
}

pub fn leak_finding(session: &str, pid: u32, gpu: u32) -> Value {
    json!({
        "id": format!("{session}/leak"), "kind": "leak", "state": "firing", "severity": "critical",
        "session": session, "job": "llama-ft", "rank": 0, "pid": pid, "ns_pid": 17,
        "gpu_uuid": format!("GPU-{gpu:08x}-2222-3333-4444-555555555555"), "gpu": gpu.to_string(),
        "first_step": 812, "first_ts": NOW - 44.0, "since": NOW - 44.0, "updated_ts": NOW,
        "resolved_ts": null,
        "message": "allocated floor grows 2.0 MiB/step since step 610; at this rate the GPU is full in ~4h10m (step ~31,000)",
        "hint": "a tensor kept with its graph (e.g. appending loss to a list): store loss.item() instead",
        "evidence": {"slope_bytes_per_step": 2_097_152.0, "slope_bytes_per_second": 4_194_304.0,
            "growth_bytes": 607_125_504u64, "confidence": 0.999, "oom_eta_steps": 30_100,
            "oom_eta_seconds": 15_050.0}
    })
}

fn resolved_fragmentation() -> Value {
    json!({
        "id": "s-1/fragmentation", "kind": "fragmentation", "state": "resolved", "severity": "warning",
        "session": "s-1", "job": "bert-base", "rank": 0, "pid": 4243, "gpu": "0",
        "first_ts": NOW - 1_500.0, "since": NOW - 1_500.0, "updated_ts": NOW - 130.0,
        "resolved_ts": NOW - 130.0,
        "message": "reserved − allocated was 61% of reserved (7.3 GiB) while the device was 93% full",
        "hint": "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "evidence": {"ratio": 0.61, "fragmented_bytes": 7_838_315_315u64}
    })
}

fn near_limit() -> Value {
    json!({
        "id": "s-3/near_limit", "kind": "near_limit", "state": "firing", "severity": "warning",
        "session": "s-3", "job": "llama-ft", "rank": 0, "pid": 4242, "gpu": "0",
        "first_ts": NOW - 20.0, "since": NOW - 20.0, "updated_ts": NOW,
        "message": "headroom 3.1 GiB is under the 5% margin",
        "hint": "lower the batch size or enable activation checkpointing",
        "evidence": {"headroom_bytes": 3_328_599_654i64}
    })
}

/// A firing leak (and near-limit) on llama-ft, a resolved fragmentation finding on bert-base.
pub fn firing_leak() -> App {
    app(vec![(
        daemon("http://127.0.0.1:9477"),
        vec![snap(firing_leak_snapshot())],
    )])
}

/// `firing_leak` with the leak's hint as the daemon words it (`message::hint`): three lines at
/// 80 columns, more than the Findings pane has for it there.
pub fn firing_leak_worded() -> App {
    let mut s = firing_leak_snapshot();
    let hint =
        crate::core::detect::message::hint(crate::core::detect::Kind::Leak, &Default::default());
    for f in s.findings.iter_mut() {
        if f.kind == crate::core::detect::Kind::Leak {
            f.hint = hint.clone();
        }
    }
    app(vec![(daemon("http://127.0.0.1:9477"), vec![snap(s)])])
}

fn firing_leak_snapshot() -> Snapshot {
    snapshot(
        "gpu-node-1",
        vec![gpu(0, 71 * GIB), gpu(1, 40 * GIB + 272 * MIB)],
        node_processes(),
        vec![leaking(), bert()],
        vec![
            leak_finding("s-3", 4242, 0),
            near_limit(),
            resolved_fragmentation(),
        ],
    )
}
