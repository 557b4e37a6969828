//! `gpumon demo` shows orphaned memory: a zombie its launcher never reaps, listed by the
//! simulated NVML, flagged as the only orphaned_memory finding of the node and named with its
//! launcher. The grace is shortened in the demo's config, so the test does not wait a minute.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");

fn snapshot(url: &str) -> Value {
    let body = ureq::get(&format!("{url}/api/v1/snapshot"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    serde_json::from_str(&body).unwrap()
}

#[test]
fn the_demo_shows_one_orphaned_memory_finding() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpumon.toml");
    std::fs::write(&config, "[detect]\norphan_grace = \"3s\"\n").unwrap();
    let mut demo = Command::new(BIN)
        .args(["demo", "--headless", "--listen", "127.0.0.1:0"])
        .env("GPUMON_CONFIG", &config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(demo.stdout.take().unwrap());
    let mut banner = String::new();
    for _ in 0..5 {
        out.read_line(&mut banner).unwrap();
    }
    let url = banner
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    let line = banner
        .lines()
        .find(|l| l.starts_with("orphaned memory: 320 MiB on GPU 1 held by pid "))
        .unwrap_or_else(|| panic!("{banner}"));
    let pid: u64 = line["orphaned memory: 320 MiB on GPU 1 held by pid ".len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    // Exited half a second in; seen as a zombie within the daemon's recheck (10 s), then the grace.
    let started = Instant::now();
    let found = loop {
        let s = snapshot(&url);
        let orphans: Vec<Value> = s["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "orphaned_memory")
            .cloned()
            .collect();
        if !orphans.is_empty() {
            break (s, orphans);
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "no orphaned_memory: {}",
            s["findings"]
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let (s, orphans) = found;
    assert_eq!(orphans.len(), 1, "{orphans:#?}");
    let f = &orphans[0];
    assert_eq!(
        (f["pid"].as_u64(), f["gpu"].as_str(), f["state"].as_str()),
        (Some(pid), Some("1"), Some("firing"))
    );
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!(
            "GPU 1: 320.0 MiB held by pid {pid} (python), which exited at least "
        )),
        "{msg}"
    );
    assert!(msg.contains(" (torchrun)"), "{msg}");
    let row = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap();
    assert_eq!(row["state"], "zombie");
    assert_eq!(
        s["host_pids"],
        if std::fs::read_link("/proc/self/ns/pid").unwrap().to_str() == Some("pid:[4026531836]") {
            "visible"
        } else {
            "partial"
        }
    );

    unsafe {
        libc::kill(demo.id() as i32, libc::SIGTERM);
    }
    assert!(demo.wait().unwrap().success());
    // The launcher went with the demo, and init reaped its zombie.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::metadata(format!("/proc/{pid}")).is_ok() {
        assert!(Instant::now() < deadline, "pid {pid} is still there");
        std::thread::sleep(Duration::from_millis(100));
    }
}
