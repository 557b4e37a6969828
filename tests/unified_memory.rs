//! A unified-memory GPU shaped on GB10 (the fake library's `gb10` scenario: memory info answers
//! NVML_ERROR_NOT_SUPPORTED, the processes are listed), through the real daemon with a /proc
//! whose meminfo the test sets: the device's used memory is its processes' sum, its limit that
//! plus the host's MemAvailable, in the API, /metrics and `gpumon status`; a trainer whose torch
//! reports the host's figures is judged near its limit against that same limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const GB10: &str = "GPU-b10b10b1-0000-4000-8000-000000000000";
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// The scenario's two processes: 20 GiB and 4 GiB.
const USED: u64 = 24 * GIB;
/// What the test's host has available: less than the daemon's margin for near_limit.
const AVAILABLE: u64 = 300 * MIB;

/// A /proc with the host's meminfo and the scenario's processes, in cgroups that set no limit.
fn procfs(dir: &Path) {
    std::fs::write(dir.join("stat"), "cpu 0 0 0 0 0 0 0 0 0 0\n").unwrap();
    std::fs::write(
        dir.join("meminfo"),
        format!(
            "MemTotal:       {} kB\nMemFree:        {} kB\nMemAvailable:   {} kB\n",
            128 * GIB / 1024,
            100 * MIB / 1024,
            AVAILABLE / 1024
        ),
    )
    .unwrap();
    for pid in [6100, 6101] {
        let p = dir.join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("comm"), "python\n").unwrap();
        std::fs::write(p.join("cgroup"), "0::/gpumon-test-no-such.slice\n").unwrap();
    }
}

/// torch on the device: its own figures are the host's (128 GiB, 90 GiB free), as
/// `torch.cuda.mem_get_info` gives them on a unified device; 2 GiB reserved, the peak 60 MiB
/// under it.
fn torch_sample(step: u64) -> String {
    let reserved = 2 * GIB;
    format!(
        "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{},\"allocated_bytes.all.peak\":{},\"reserved_bytes.all.current\":{reserved},\"num_alloc_retries\":0,\"num_ooms\":0}},\"device_free\":{},\"device_total\":{}}}\n",
        1_763_700_000 + step,
        GIB,
        reserved - 60 * MIB,
        90 * GIB,
        128 * GIB,
    )
}

fn finding(d: &Daemon, kind: &str) -> Option<serde_json::Value> {
    d.snapshot()["findings"]
        .as_array()?
        .iter()
        .find(|f| f["kind"] == kind && f["state"] == "firing")
        .cloned()
}

#[test]
fn a_unified_gpu_is_shown_with_the_hosts_limit_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    procfs(dir.path());
    let gb10 = scenario("gb10");
    let traces = tempfile::tempdir().unwrap();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&gb10),
        args: DaemonOpts::default_args_and(vec![
            "--procfs".into(),
            dir.path().display().to_string(),
            "--record-dir".into(),
            traces.path().display().to_string(),
        ]),
        ..DaemonOpts::default()
    });

    // The API's GPU: unified, its figures and which one bounds it.
    let snap = d.snapshot();
    let g = &snap["gpus"][0];
    assert_eq!(g["name"], "NVIDIA GB10", "{g}");
    let u = &g["unified"];
    assert_eq!(u["processes_used"].as_u64(), Some(USED), "{g}");
    assert_eq!(u["host_available"].as_u64(), Some(AVAILABLE), "{g}");
    assert!(u["cgroup_headroom"].is_null(), "{g}");
    assert_eq!(u["limit_from"], "host_available", "{g}");
    let m = &g["memory"];
    assert_eq!(m["used"].as_u64(), Some(USED), "{g}");
    assert_eq!(m["free"].as_u64(), Some(AVAILABLE), "{g}");
    assert_eq!(m["total"].as_u64(), Some(USED + AVAILABLE), "{g}");

    // /metrics: the same total, the unified marks, no reserved figure NVML never gave.
    let metrics = d.metrics();
    let l = format!("{{gpu=\"0\",uuid=\"{GB10}\"}}");
    let at = |name: &str| sample(&metrics, &format!("{name}{l}"));
    assert_eq!(
        at("gpumon_gpu_memory_total_bytes"),
        Some((USED + AVAILABLE) as f64),
        "{metrics}"
    );
    assert_eq!(at("gpumon_gpu_memory_used_bytes"), Some(USED as f64));
    assert_eq!(at("gpumon_gpu_unified_memory_info"), Some(1.0));
    assert_eq!(
        at("gpumon_gpu_unified_host_available_bytes"),
        Some(AVAILABLE as f64)
    );
    assert_eq!(at("gpumon_gpu_memory_reserved_bytes"), None, "{metrics}");
    assert_eq!(
        count_series(&metrics, "gpumon_gpu_unified_cgroup_headroom_bytes"),
        0
    );
    promtool_check(&metrics);

    // A trainer on the device: its samples are judged against the unified limit, not the
    // 90 GiB torch reports free on the host.
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    let hello = format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"spark\",\"rank\":0,\"gpu_uuid\":\"{GB10}\"}}\n"
    );
    w.write_all(hello.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.contains("welcome"), "{line}");
    for step in 1..=10 {
        w.write_all(torch_sample(step).as_bytes()).unwrap();
    }
    d.wait_for(Duration::from_secs(10), "near_limit firing", || {
        finding(&d, "near_limit").is_some()
    });
    let f = finding(&d, "near_limit").unwrap();
    assert_eq!(
        f["evidence"]["headroom_bytes"].as_u64(),
        Some(AVAILABLE + 60 * MIB),
        "{f}"
    );
    let session = &d.snapshot()["sessions"][0];
    assert_eq!(session["gpu"], 0, "{session}");
    assert_eq!(
        session["device_free"].as_u64(),
        Some(AVAILABLE),
        "{session}"
    );
    assert_eq!(
        session["device_total"].as_u64(),
        Some(USED + AVAILABLE),
        "{session}"
    );

    // `gpumon status` says so, and why the total is what it is.
    let out = Command::new(BIN)
        .args(["status", "--connect", &d.url("")])
        .env_remove("GPUMON_LISTEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains("NVIDIA GB10"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("ok (unified; limit: host_available)"), "{row}");
    assert!(row.contains("24.0 GiB") && row.contains("n/a"), "{row}");
    assert!(
        text.contains("  unified    the GPU shares the host's memory"),
        "{text}"
    );

    // Offline: the trace notes the device's figures, and the replay judges against them too.
    drop(w);
    assert_eq!(d.stop().code(), Some(0));
    let (_, report) = analyze_json(&recorded_trace(traces.path()));
    let t = &report["traces"][0];
    assert_eq!(t["unified"], true, "{report}");
    let f = t["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "near_limit")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(
        f["evidence"]["headroom_bytes"].as_u64(),
        Some(AVAILABLE + 60 * MIB),
        "{report}"
    );
}

/// Without the host's figure the limit is "n/a", never a guess: no total in the API or /metrics.
#[test]
fn without_meminfo_the_unified_limit_is_not_available() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stat"), "cpu 0 0 0 0 0 0 0 0 0 0\n").unwrap();
    let gb10 = scenario("gb10");
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&gb10),
        args: DaemonOpts::default_args_and(vec![
            "--procfs".into(),
            dir.path().display().to_string(),
        ]),
        ..DaemonOpts::default()
    });
    let snap = d.snapshot();
    let g = &snap["gpus"][0];
    assert_eq!(g["unified"]["processes_used"].as_u64(), Some(USED), "{g}");
    assert!(g["unified"]["host_available"].is_null(), "{g}");
    assert!(g["memory"].is_null(), "{g}");
    let metrics = d.metrics();
    assert_eq!(count_series(&metrics, "gpumon_gpu_memory_total_bytes"), 0);
    assert_eq!(count_series(&metrics, "gpumon_gpu_unified_memory_info"), 1);
}
