//! `untracked_growth` through the session store: NVML's figure joined onto each sample by pid
//! and GPU, the leak's trend test on what lies outside the allocator. Its traps (the CUDA
//! context at the first step, NCCL's warm-up, a one-time workspace, a leak of tensors whose
//! cache growth NVML sees a poll late) raise nothing.

use super::*;
use crate::core::detect::{Finding, FindingState, Kind};
use crate::core::model::NodeReading;

const GIB: f64 = 1073741824.0;
const MIB: f64 = 1048576.0;
const TOTAL: u64 = 85_520_809_984;
const PEER: Peer = Peer {
    pid: 4242,
    uid: 1000,
    gid: 1000,
};

/// Deterministic pseudo-noise in [0, 1).
fn noise(i: u64) -> f64 {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x % 1_000_000) as f64 / 1_000_000.0
}

fn poll(ts: f64, used: u64) -> NodeReading {
    NodeReading {
        ts,
        driver_version: None,
        gpus: vec![],
        processes: vec![super::nvml::tests::process(PEER.pid, "GPU-a", used)],
    }
}

/// Runs `steps` steps of 0.5 s, polled every other step (NVML sees each poll's memory, the
/// sample after it pairs with it), with allocated, reserved and outside given per step;
/// returns the findings raised.
fn run(
    steps: u64,
    allocated: impl Fn(u64) -> f64,
    reserved: impl Fn(u64) -> f64,
    outside: impl Fn(u64) -> f64,
) -> Vec<Finding> {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let hello = Hello {
        v: 1,
        gpu_uuid: Some("GPU-a".into()),
        ..Hello::default()
    };
    let t0 = 1_763_700_000.0;
    let (key, _) = s.open(&mut jobs, PEER, hello, t0);
    let mut fired = Vec::new();
    for i in 0..steps {
        let ts = t0 + i as f64 * 0.5;
        if i % 2 == 0 {
            s.polled(&poll(ts, (reserved(i) + outside(i)) as u64));
        }
        let a = allocated(i) as u64;
        let sample = Sample {
            ts: ts + 0.1,
            step: Some(i),
            phase: "train".into(),
            stats: Stats {
                allocated: Some(a),
                allocated_peak: Some(a + (8.0 * GIB) as u64),
                reserved: Some(reserved(i) as u64),
                ..Stats::default()
            },
            device_free: Some(TOTAL - (reserved(i) + outside(i)) as u64),
            device_total: Some(TOTAL),
            alloc_limit: None,
            categories: None,
        };
        s.sample(key, sample, ts + 0.1);
        fired.extend(
            s.findings
                .drain()
                .into_iter()
                .filter(|f| f.state == FindingState::Firing),
        );
    }
    fired
}

/// Live tensors noisy under a cache that holds still (the allocator keeps what it reserved).
fn flat(base: f64) -> impl Fn(u64) -> f64 {
    move |i| base + noise(i) * 300.0 * MIB
}

const CACHE: f64 = 22.5 * GIB;

#[test]
fn growth_outside_a_flat_allocator_is_found_and_named() {
    let f = run(
        6_000,
        flat(20.0 * GIB),
        |_| CACHE,
        |i| 900.0 * MIB + noise(i + 7) * 40.0 * MIB + (i.saturating_sub(1_000) as f64) * 2.0 * MIB,
    );
    let kinds: Vec<Kind> = f.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, vec![Kind::UntrackedGrowth], "{f:#?}");
    let g = &f[0];
    let e = &g.evidence;
    let slope = e.slope_bytes_per_step.unwrap() / MIB;
    assert!((1.6..2.4).contains(&slope), "{slope} MiB/step");
    assert!(e.onset_step.unwrap() >= 900, "{e:?}");
    // Found within a few hundred steps of the onset, as a leak of this rate is.
    assert!(g.first_step.unwrap() < 1_600, "{g:?}");
    assert!(
        e.outside_allocator_bytes.unwrap() as f64 > 1.3 * GIB,
        "{e:?}"
    );
    assert!(e.oom_eta_seconds.is_some(), "{e:?}");
    assert!(
        g.message
            .starts_with("memory outside PyTorch's allocator grows 2.0 MiB/step since step"),
        "{}",
        g.message
    );
    assert!(g.hint.as_deref().unwrap().contains("NCCL"), "{:?}", g.hint);
}

#[test]
fn context_warm_up_and_a_one_time_workspace_are_not_growth() {
    let f = run(
        20_000,
        flat(20.0 * GIB),
        |_| CACHE,
        |i| {
            // The CUDA context from the first step, NCCL's buffers growing over the first 200
            // steps, a 1 GiB workspace for a new shape at step 8,000.
            let nccl = (i.min(200) as f64) * 4.0 * MIB;
            let workspace = if i >= 8_000 { GIB } else { 0.0 };
            500.0 * MIB + nccl + workspace + noise(i + 3) * 60.0 * MIB
        },
    );
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn a_tensor_leak_is_a_leak_not_growth_outside() {
    // The cache grows with the leak, and NVML sees it a poll late: what lies outside reads
    // low for a sample, never high.
    let allocated = |i: u64| 20.0 * GIB + i as f64 * 2.0 * MIB + noise(i) * 300.0 * MIB;
    // The cache grows in 20 MiB segments, ahead of what is allocated.
    let reserved =
        |i: u64| ((20.0 * GIB + i as f64 * 2.0 * MIB) / (20.0 * MIB)).ceil() * 20.0 * MIB + GIB;
    let f = run(6_000, allocated, reserved, |i| {
        700.0 * MIB + noise(i + 1) * 20.0 * MIB
    });
    let kinds: Vec<Kind> = f.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, vec![Kind::Leak], "{f:#?}");
}

#[test]
fn without_a_figure_of_its_own_nothing_is_judged() {
    // No poll lists the process: the detector has no floor and stays silent.
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let (key, _) = s.open(&mut jobs, PEER, Hello::default(), 0.0);
    s.polled(&poll(0.0, 5 << 30));
    assert_eq!(s.live.get(&key).unwrap().nvml, None, "no gpu_uuid, no join");
}
