//! `gpumon analyze` raises `cache_growth` on a recorded trace whose reserved memory creeps while
//! allocated stays flat (the daemon's detectors, replayed), names the allocator settings the
//! hello carried, and stays quiet on a cache that grows and stops, and on a leak (that is a
//! `leak`, not both).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fmt::Write as _;
use std::path::Path;

use common::{analyze_json, kinds};

const GIB: f64 = 1073741824.0;
const MIB: f64 = 1048576.0;
const TOTAL: u64 = 85_520_809_984;
const OUTSIDE: f64 = 600.0 * MIB;

/// A trace of `steps` steps of 0.25 s, sampled every `every`: hello (with `alloc_conf`), a
/// sample per sampled step, bye.
fn trace(
    dir: &Path,
    name: &str,
    steps: u64,
    every: u64,
    allocated: impl Fn(u64) -> f64,
    reserved: impl Fn(u64) -> f64,
) -> std::path::PathBuf {
    let t0 = 1_763_700_000.0;
    let mut s = String::new();
    s.push_str(r#"{"type":"hello","v":1,"pid":4242,"job":"j","rank":0,"alloc_conf":"max_split_size_mb:128,expandable_segments:True"}"#);
    s.push('\n');
    for i in (0..steps).step_by(every as usize) {
        let (a, r) = (allocated(i) as u64, reserved(i) as u64);
        let _ = writeln!(
            s,
            r#"{{"type":"sample","ts":{:.3},"step":{i},"phase":"train","stats":{{"allocated_bytes.all.current":{a},"allocated_bytes.all.peak":{},"reserved_bytes.all.current":{r}}},"device_free":{},"device_total":{TOTAL}}}"#,
            t0 + i as f64 * 0.25,
            a + (512.0 * MIB) as u64,
            TOTAL - r - OUTSIDE as u64
        );
    }
    let _ = writeln!(
        s,
        r#"{{"type":"bye","ts":{:.3}}}"#,
        t0 + steps as f64 * 0.25
    );
    let path = dir.join(name);
    std::fs::write(&path, s).unwrap();
    path
}

fn flat(i: u64) -> f64 {
    GIB + (i % 7) as f64 * 9.0 * MIB
}

fn creep(i: u64) -> f64 {
    2.0 * GIB + 138.0 * MIB * i as f64
}

#[test]
fn a_creeping_cache_is_found_offline_before_half_the_device_at_both_cadences() {
    let dir = tempfile::tempdir().unwrap();
    for every in [1, 8] {
        // Until reserved is 90% of the device.
        let t = trace(dir.path(), "creep.jsonl", 540, every, flat, creep);
        let (code, r) = analyze_json(&t);
        assert_eq!(code, Some(1), "{r:#}");
        assert_eq!(kinds(&r), vec!["cache_growth"], "every {every}: {r:#}");
        let f = &r["traces"][0]["findings"][0];
        let first = f["first_step"].as_u64().unwrap();
        assert!(creep(first) < TOTAL as f64 / 2.0, "every {every}: {f:#}");
        let message = f["message"].as_str().unwrap();
        assert!(
            message.contains("reserved memory (PyTorch's cache) grows"),
            "{message}"
        );
        let hint = f["hint"].as_str().unwrap();
        assert!(
            hint.contains(r#""max_split_size_mb:128,expandable_segments:True""#),
            "{hint}"
        );
    }
}

#[test]
fn a_cache_that_grows_and_stops_and_a_leak_raise_no_cache_growth() {
    let dir = tempfile::tempdir().unwrap();
    // Grows 8 GiB over the first 200 steps in stairs, then holds.
    let stairs = |i: u64| 6.0 * GIB + (i.min(200) / 25) as f64 * GIB;
    let t = trace(dir.path(), "stairs.jsonl", 4_000, 1, flat, stairs);
    let (_, r) = analyze_json(&t);
    assert!(kinds(&r).is_empty(), "{r:#}");
    // A leak of 20 MiB a step: reserved follows allocated.
    let leak = |i: u64| flat(i) + 20.0 * MIB * i as f64;
    let t = trace(dir.path(), "leak.jsonl", 3_000, 1, leak, |i| {
        leak(i) * 1.05 + 2.0 * GIB
    });
    let (_, r) = analyze_json(&t);
    assert_eq!(kinds(&r), vec!["leak"], "{r:#}");
}
