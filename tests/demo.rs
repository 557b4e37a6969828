//! `gpumon demo --headless` as a newcomer runs it: URL and socket on the first lines, the leak
//! flagged within about a minute, near_limit on the near-limit trainer, the simulated NVML listing
//! the trainer children with the memory they report, and no child left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::get;

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[test]
fn the_demo_flags_the_leak_within_a_minute_and_cleans_up() {
    let mut child = Command::new(BIN)
        .args(["demo", "--headless", "--listen", "127.0.0.1:0"])
        .env("GPUMON_CONFIG", "/dev/null")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL on the first line: {first:?}"))
        .to_string();
    let mut second = String::new();
    out.read_line(&mut second).unwrap();
    let socket = second.strip_prefix("socket: ").unwrap().trim().to_string();
    assert!(std::path::Path::new(&socket).exists(), "{socket}");

    let started = Instant::now();
    let snap = |url: &str| -> serde_json::Value {
        serde_json::from_str(&get(&format!("{url}/api/v1/snapshot")).1).unwrap()
    };
    let firing = |s: &serde_json::Value, kind: &str, job: &str| {
        s["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == kind && f["state"] == "firing" && f["job"] == job)
    };
    let mut s = snap(&url);
    while !(firing(&s, "leak", "demo-leak") && firing(&s, "near_limit", "demo-near-limit")) {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "leak and near_limit not both firing after 90 s: {}",
            s["findings"]
        );
        std::thread::sleep(Duration::from_millis(500));
        s = snap(&url);
    }
    println!(
        "leak flagged {:.0} s after start",
        started.elapsed().as_secs_f64()
    );
    assert!(
        !firing(&s, "leak", "demo-healthy"),
        "the healthy trainer is not a leak"
    );

    // Each trainer is a real child whose pid the simulated NVML lists, with the memory it reports
    // (reserved + a 512 MiB CUDA context), joined to its session.
    let sessions = s["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 3);
    let mut pids = Vec::new();
    for sess in sessions {
        let pid = sess["pid"].as_u64().unwrap();
        pids.push(pid);
        assert!(alive(pid));
        let nvml = sess["nvml"]["used_memory_bytes"].as_f64().unwrap();
        let reserved = sess["stats"]["reserved"].as_f64().unwrap();
        let expected = reserved + 512.0 * 1048576.0;
        // The leak moves 40 MiB/s between the two reads: allow a few seconds of it.
        assert!(
            (nvml - expected).abs() < 512.0 * 1048576.0,
            "{}: nvml {nvml} vs reserved+context {expected}",
            sess["job"]
        );
    }
    let gpus = s["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);

    // SIGTERM: the demo stops its daemon and its children.
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert!(child.wait().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) {
        assert!(Instant::now() < deadline, "children still alive: {pids:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !std::path::Path::new(&socket).exists(),
        "the demo's scratch dir is removed"
    );
}
