//! `gpumon analyze` replays NVML's figure from a trace's `trace_nvml` lines, as the daemon joined
//! it live, and raises `untracked_growth` on growth outside the allocator only: not on the CUDA
//! context, NCCL's warm-up or a one-time workspace, not on a leak of tensors, and not when the
//! trace has no figure at all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fmt::Write as _;
use std::path::Path;

use common::{analyze_json, kinds};

const GIB: f64 = 1073741824.0;
const MIB: f64 = 1048576.0;
const TOTAL: u64 = 85_520_809_984;

/// Deterministic pseudo-noise in [0, 1).
fn noise(i: u64) -> f64 {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x % 1_000_000) as f64 / 1_000_000.0
}

/// A recorded trace of `steps` steps of 0.5 s: hello, the `trace_gpu` note, a sample per step,
/// and (when `nvml`) NVML's figure (reserved + outside) noted before every other sample, as the
/// recorder writes it after each poll; then bye.
fn trace(
    dir: &Path,
    name: &str,
    steps: u64,
    nvml: bool,
    allocated: impl Fn(u64) -> f64,
    reserved: impl Fn(u64) -> f64,
    outside: impl Fn(u64) -> f64,
) -> std::path::PathBuf {
    let t0 = 1_763_700_000.0;
    let mut s = String::new();
    s.push_str(r#"{"type":"hello","v":1,"pid":4242,"job":"j","rank":0,"gpu_uuid":"GPU-a"}"#);
    s.push('\n');
    s.push_str(r#"{"type":"trace_gpu","gpu":"0","gpu_uuid":"GPU-a","ts":1763700000.000}"#);
    s.push('\n');
    for i in 0..steps {
        let ts = t0 + i as f64 * 0.5;
        let (a, r, o) = (allocated(i) as u64, reserved(i) as u64, outside(i) as u64);
        if nvml && i % 2 == 0 {
            let _ = writeln!(
                s,
                r#"{{"type":"trace_nvml","used_bytes":{},"ts":{ts:.3}}}"#,
                r + o
            );
        }
        let _ = writeln!(
            s,
            r#"{{"type":"sample","ts":{:.3},"step":{i},"phase":"train","stats":{{"allocated_bytes.all.current":{a},"allocated_bytes.all.peak":{},"reserved_bytes.all.current":{r}}},"device_free":{},"device_total":{TOTAL}}}"#,
            ts + 0.1,
            a + (8.0 * GIB) as u64,
            TOTAL - r - o
        );
    }
    let _ = writeln!(s, r#"{{"type":"bye","ts":{:.3}}}"#, t0 + steps as f64 * 0.5);
    let path = dir.join(name);
    std::fs::write(&path, s).unwrap();
    path
}

fn flat(i: u64) -> f64 {
    20.0 * GIB + noise(i) * 300.0 * MIB
}

const CACHE: f64 = 22.5 * GIB;

#[test]
fn growth_outside_the_allocator_is_found_offline_with_its_forecast() {
    let dir = tempfile::tempdir().unwrap();
    let outside = |i: u64| {
        900.0 * MIB + noise(i + 7) * 40.0 * MIB + i.saturating_sub(1_000) as f64 * 2.0 * MIB
    };
    let t = trace(
        dir.path(),
        "grow.jsonl",
        6_000,
        true,
        flat,
        |_| CACHE,
        outside,
    );
    let (code, r) = analyze_json(&t);
    assert_eq!(code, Some(1), "{r:#}");
    assert_eq!(kinds(&r), vec!["untracked_growth"], "{r:#}");
    let f = &r["traces"][0]["findings"][0];
    let e = &f["evidence"];
    let slope = e["slope_bytes_per_step"].as_f64().unwrap() / MIB;
    assert!((1.6..2.4).contains(&slope), "{slope}");
    assert!(e["oom_eta_seconds"].as_f64().is_some(), "{f:#}");
    assert!(f["first_step"].as_u64().unwrap() < 1_600, "{f:#}");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .starts_with("memory outside PyTorch's allocator grows 2.0 MiB/step"),
        "{f:#}"
    );
    // The same samples without the daemon's figure: nothing to judge, nothing raised.
    let t = trace(
        dir.path(),
        "blind.jsonl",
        6_000,
        false,
        flat,
        |_| CACHE,
        outside,
    );
    let (code, r) = analyze_json(&t);
    assert_eq!((code, kinds(&r)), (Some(0), vec![]), "{r:#}");
}

#[test]
fn context_warm_up_and_a_one_time_workspace_raise_nothing_offline() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(
        dir.path(),
        "traps.jsonl",
        20_000,
        true,
        flat,
        |_| CACHE,
        |i| {
            let nccl = i.min(200) as f64 * 4.0 * MIB;
            let workspace = if i >= 8_000 { GIB } else { 0.0 };
            500.0 * MIB + nccl + workspace + noise(i + 3) * 60.0 * MIB
        },
    );
    let (code, r) = analyze_json(&t);
    assert_eq!((code, kinds(&r)), (Some(0), vec![]), "{r:#}");
}

#[test]
fn a_tensor_leak_stays_a_leak_offline() {
    let dir = tempfile::tempdir().unwrap();
    let t = trace(
        dir.path(),
        "leak.jsonl",
        6_000,
        true,
        |i| 20.0 * GIB + i as f64 * 2.0 * MIB + noise(i) * 300.0 * MIB,
        |i| ((20.0 * GIB + i as f64 * 2.0 * MIB) / (20.0 * MIB)).ceil() * 20.0 * MIB + GIB,
        |i| 700.0 * MIB + noise(i + 1) * 20.0 * MIB,
    );
    let (code, r) = analyze_json(&t);
    assert_eq!(
        (code, kinds(&r)),
        (Some(1), vec!["leak".to_string()]),
        "{r:#}"
    );
}
