//! Oracle test: gpustat (a third-party NVML reader we did not write, via NVIDIA's nvidia-ml-py)
//! must report the scenario's numbers when it loads the fake as `libnvidia-ml.so.1`.
//!
//! Needs `pip install gpustat` (gpustat >= 1.1, which pulls in nvidia-ml-py and psutil). Without
//! it this test fails and says so; set FAKE_NVML_SKIP_GPUSTAT=1 to skip it explicitly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fake_nvml::harness;
use serde_json::Value as Json;
use std::path::Path;
use std::process::{Child, Command};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Real processes for gpustat's psutil lookups; killed on drop.
struct Sleepers(Vec<Child>);

impl Sleepers {
    fn spawn(n: usize) -> Sleepers {
        Sleepers(
            (0..n)
                .map(|_| Command::new("sleep").arg("300").spawn().unwrap())
                .collect(),
        )
    }
    fn pid(&self, i: usize) -> u32 {
        self.0[i].id()
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn gpustat_available() -> bool {
    Command::new("gpustat")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `gpustat --json` against `scenario` at pinned time `t`.
fn gpustat(scenario: &Path, t: f64) -> Json {
    let mut ld = harness::soname_dir().into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        ld.push(":");
        ld.push(old);
    }
    let out = Command::new("gpustat")
        .arg("--json")
        .env("LD_LIBRARY_PATH", ld)
        .env(fake_nvml::ENV_SCENARIO, scenario)
        .env(fake_nvml::ENV_TIME, t.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "gpustat --json failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("gpustat output is not JSON ({e}):\n{stdout}"))
}

fn procs(gpu: &Json) -> Vec<(u64, Json)> {
    gpu["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pid"].as_u64().unwrap(), p["gpu_memory_usage"].clone()))
        .collect()
}

fn check_generated_scenario() {
    let sleepers = Sleepers::spawn(3);
    let (a, b, c) = (sleepers.pid(0), sleepers.pid(1), sleepers.pid(2));
    let total = 85520809984u64;
    let reserved = 567279616u64;
    let extra = 100 * MIB + 12345;
    let a_used = GIB + 123;
    let b_used = 3 * GIB + 5 * MIB;
    let missing_pid = 4_000_000; // above Linux's pid_max: never a live process
    let scenario = format!(
        r#"
driver_version = "550.99.01"
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-0a0a0a0a-0000-4000-8000-000000000000"
memory_total = {total}
memory_reserved = {reserved}
memory_used_extra = {extra}
utilization_gpu = 37
encoder_utilization = 5
decoder_utilization = 6
temperature = 41
fan_speed = 30
power_usage_mw = 123456
power_limit_mw = 700000
[[gpu.process]]
pid = {a}
kind = "both"
used = {a_used}
[[gpu.process]]
pid = {b}
kind = "graphics"
used = {b_used}
[[gpu.process]]
pid = {missing_pid}
used = {GIB}

[[gpu]]
name = "NVIDIA RTX A4000"
memory_total = 17171480576
[[gpu.process]]
pid = {c}
used = "n/a"
"#
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpustat-oracle");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("generated-{}.toml", std::process::id()));
    std::fs::write(&path, scenario).unwrap();

    let j = gpustat(&path, 0.0);
    assert_eq!(j["driver_version"], "550.99.01");
    let gpus = j["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);

    let g0 = &gpus[0];
    assert_eq!(g0["index"], 0);
    assert_eq!(g0["uuid"], "GPU-0a0a0a0a-0000-4000-8000-000000000000");
    assert_eq!(g0["name"], "NVIDIA H100 80GB HBM3");
    assert_eq!(g0["memory.total"], total / MIB);
    // gpustat >= 1.1 with nvidia-ml-py >= 11.510.69 reads nvmlDeviceGetMemoryInfo_v2, whose
    // `used` excludes reserved memory (the v1 struct would give used + reserved).
    let used_v2 = extra + a_used + b_used + GIB;
    assert_eq!(
        g0["memory.used"],
        used_v2 / MIB,
        "memory.used should be the v2 value {} MiB (v1 would be {} MiB)",
        used_v2 / MIB,
        (used_v2 + reserved) / MIB
    );
    assert_eq!(g0["temperature.gpu"], 41);
    assert_eq!(g0["fan.speed"], 30);
    assert_eq!(g0["utilization.gpu"], 37);
    assert_eq!(g0["utilization.enc"], 5);
    assert_eq!(g0["utilization.dec"], 6);
    assert_eq!(g0["power.draw"], 123);
    assert_eq!(g0["enforced.power.limit"], 700);
    // The "both" process is listed once; the pid that does not exist is dropped by psutil.
    assert_eq!(
        procs(g0),
        vec![
            (u64::from(a), Json::from(a_used / MIB)),
            (u64::from(b), Json::from(b_used / MIB))
        ]
    );

    let g1 = &gpus[1];
    assert_eq!(g1["memory.total"], 17171480576u64 / MIB);
    assert_eq!(g1["memory.used"], 0);
    assert_eq!(
        g1["temperature.gpu"],
        Json::Null,
        "NOT_SUPPORTED becomes null"
    );
    assert_eq!(g1["power.draw"], Json::Null);
    assert_eq!(g1["utilization.gpu"], Json::Null);
    assert_eq!(
        procs(g1),
        vec![(u64::from(c), Json::Null)],
        "n/a memory becomes null"
    );
    let _ = std::fs::remove_file(&path);
}

fn check_shipped_scenarios() {
    // Memory of every GPU of the benchmark scenario (its pids are synthetic, so processes are
    // not compared: psutil may or may not find a host process with such a pid).
    let j = gpustat(&harness::scenario_path("eight_gpus_128"), 0.0);
    let gpus = j["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    for (g, gpu) in gpus.iter().enumerate() {
        assert_eq!(gpu["index"], g);
        assert_eq!(gpu["memory.total"], 85520809984u64 / MIB);
        assert_eq!(gpu["memory.used"], 42882564096u64 / MIB);
    }
    // Ramp at t = 10: 11 GiB + 4 GiB + 128 MiB.
    let j = gpustat(&harness::scenario_path("ramp"), 10.0);
    assert_eq!(j["gpus"][0]["memory.used"], (15 * GIB + 128 * MIB) / MIB);
    // A GPU that fell off the bus is reported as lost; the other one is unaffected.
    let j = gpustat(&harness::scenario_path("gpu_lost"), 3.0);
    assert_eq!(j["gpus"][1]["name"], "((GPU is lost))");
    assert_eq!(j["gpus"][0]["memory.used"], 4 * GIB / MIB);
}

#[test]
fn gpustat_reports_the_scenario() {
    if std::env::var_os("FAKE_NVML_SKIP_GPUSTAT").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED: gpustat oracle test (FAKE_NVML_SKIP_GPUSTAT=1)");
        return;
    }
    assert!(
        gpustat_available(),
        "gpustat is not installed: run `pip install gpustat` (CI installs it), \
         or set FAKE_NVML_SKIP_GPUSTAT=1 to skip this oracle test"
    );
    check_generated_scenario();
    check_shipped_scenarios();
}
