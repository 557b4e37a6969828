//! /metrics equals what the scenario file says, and what gpustat (a reader we did not write)
//! reads from the same fake library.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::*;

/// What the scenario says each GPU reports (static scenarios: evaluated at t = 0).
struct ExpectedGpu {
    index: usize,
    uuid: String,
    total: u64,
    reserved: u64,
    used: u64,
    processes: Vec<(u32, Option<u64>)>,
}

fn expected(name: &str) -> Vec<ExpectedGpu> {
    use fake_nvml::readings;
    let s = fake_nvml::Scenario::load(&scenario(name)).unwrap();
    s.gpus
        .iter()
        .enumerate()
        .map(|(index, g)| {
            let mem = readings::memory(g, None, 0.0);
            let mut processes = Vec::new();
            readings::for_each_process(g, None, 0.0, |p| processes.push((p.pid, p.used)));
            ExpectedGpu {
                index,
                uuid: readings::gpu_uuid(&s, index),
                total: mem.total,
                reserved: mem.reserved,
                used: mem.used,
                processes,
            }
        })
        .collect()
}

fn uuid_of(metrics: &str, index: usize) -> String {
    let prefix = format!("gpumon_gpu_up{{gpu=\"{index}\",uuid=\"");
    let line = metrics.lines().find(|l| l.starts_with(&prefix)).unwrap();
    line[prefix.len()..].split('"').next().unwrap().to_string()
}

fn check_against_scenario(name: &str) -> (Daemon, String) {
    // An empty procfs: synthetic pids must not pick up names of real processes on this machine.
    let procfs = tempfile::tempdir().unwrap();
    let path = scenario(name);
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&path),
        args: DaemonOpts::default_args_and(vec![
            "--procfs".into(),
            procfs.path().to_str().unwrap().into(),
        ]),
        ..DaemonOpts::default()
    });
    let m = d.metrics();
    let exp = expected(name);
    assert_eq!(count_series(&m, "gpumon_gpu_info"), exp.len(), "{m}");
    let mut procs = 0;
    for g in &exp {
        let uuid = uuid_of(&m, g.index);
        assert_eq!(uuid, g.uuid);
        let l = format!("{{gpu=\"{}\",uuid=\"{uuid}\"}}", g.index);
        let get = |n: &str| sample(&m, &format!("{n}{l}")).unwrap_or_else(|| panic!("{n}{l}"));
        assert_eq!(get("gpumon_gpu_memory_total_bytes") as u64, g.total);
        assert_eq!(get("gpumon_gpu_memory_reserved_bytes") as u64, g.reserved);
        assert_eq!(get("gpumon_gpu_memory_used_bytes") as u64, g.used);
        assert_eq!(
            get("gpumon_gpu_memory_free_bytes") as u64,
            g.total - g.reserved - g.used
        );
        for (pid, used) in &g.processes {
            let prefix = format!(
                "gpumon_process_memory_used_bytes{{gpu=\"{}\",uuid=\"{uuid}\",pid=\"{pid}\",",
                g.index
            );
            let line = m.lines().find(|l| l.starts_with(&prefix));
            match used {
                Some(b) => {
                    let v: f64 = line.unwrap().rsplit(' ').next().unwrap().parse().unwrap();
                    assert_eq!(v as u64, *b, "pid {pid}");
                    procs += 1;
                }
                None => assert!(line.is_none(), "n/a memory must be absent: {line:?}"),
            }
        }
    }
    assert_eq!(count_series(&m, "gpumon_process_memory_used_bytes"), procs);
    promtool_check(&m);
    (d, m)
}

#[test]
fn two_gpus_match_the_scenario_and_the_golden_file() {
    let (d, m) = check_against_scenario("two_gpus");
    let golden =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/two_gpus.metrics");
    let got = normalise(&m);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &got).unwrap();
    }
    let want = std::fs::read_to_string(&golden).expect("golden file; create with UPDATE_GOLDEN=1");
    assert_eq!(
        got, want,
        "/metrics differs from {golden:?}; if intended, rerun with UPDATE_GOLDEN=1"
    );
    assert!(d.stop().success());
}

/// Masks what changes from run to run: timings, counters of polls, the build revision.
fn normalise(m: &str) -> String {
    m.lines()
        .map(|l| {
            // The HTTP counts depend on how many readiness polls ran and whether the last
            // connection has finished closing; the aggregator's on how many polls and views.
            if l.starts_with("gpumon_nvml_poll_duration_seconds ")
                || l.starts_with("gpumon_aggregator_inputs_total{input=\"collection\"}")
                || l.starts_with("gpumon_aggregator_busy_seconds_total ")
                || l.starts_with("gpumon_aggregator_views_total ")
                || l.starts_with("gpumon_nvml_polls_total ")
                || l.starts_with("gpumon_http_connections ")
                || l.starts_with("gpumon_http_connections_closed_total{")
            {
                format!("{} <varies>", l.split(' ').next().unwrap())
            } else if l.starts_with("gpumon_build_info{") {
                "gpumon_build_info{<build>} 1".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn eight_gpus_match_the_scenario_and_gpustat() {
    let (d, m) = check_against_scenario("eight_gpus");
    // gpustat 1.1 reads the v2 struct when nvidia-ml-py offers it (used excludes reserved) and
    // reports MiB, rounded down.
    let out = Command::new("gpustat")
        .arg("--json")
        .env("LD_LIBRARY_PATH", fake_nvml::harness::soname_dir())
        .env("FAKE_NVML_SCENARIO", scenario("eight_gpus"))
        .output()
        .expect("gpustat not found: `pip install gpustat` (scripts/check does)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpus = gs["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    const MIB: u64 = 1 << 20;
    for g in gpus {
        let index = g["index"].as_u64().unwrap() as usize;
        let uuid = g["uuid"].as_str().unwrap();
        let l = format!("{{gpu=\"{index}\",uuid=\"{uuid}\"}}");
        let ours =
            |n: &str| sample(&m, &format!("{n}{l}")).unwrap_or_else(|| panic!("{n}{l}")) as u64;
        assert_eq!(
            g["memory.total"].as_u64().unwrap(),
            ours("gpumon_gpu_memory_total_bytes") / MIB
        );
        assert_eq!(
            g["memory.used"].as_u64().unwrap(),
            ours("gpumon_gpu_memory_used_bytes") / MIB,
            "GPU {index} used"
        );
    }
    assert!(d.stop().success());
}
