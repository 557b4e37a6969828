//! The README's first command, `FAKE_NVML_SCENARIO=crates/fake-nvml/scenarios/two_gpus.toml
//! gpumon daemon --nvml-lib libfake_nvml.so`, raises nothing a real host would not: the
//! scenario's pids ran on no host, so the daemon, which recognises the fake library, judges
//! orphaned memory for zombies only, and says it reads a fake library in its log and API. The
//! same scenario declared as the host's (`host_pids = true`) raises them: the wait is long
//! enough to see what the fake library would otherwise cause.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{scenario, Daemon, DaemonOpts};
use serde_json::Value;

/// Past the grace by this many seconds of polls before judging (the grace is 1 s).
const PAST_GRACE: f64 = 4.0;

fn orphans(d: &Daemon) -> Vec<Value> {
    d.snapshot()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "orphaned_memory")
        .cloned()
        .collect()
}

/// A daemon on `path` with a 1 s orphan grace, once its polls span `PAST_GRACE` seconds.
fn past_the_grace(path: &std::path::Path) -> Daemon {
    let d = Daemon::start(DaemonOpts {
        scenario: Some(path),
        config: "[detect]\norphan_grace = \"1s\"\n".into(),
        ..DaemonOpts::default()
    });
    let first = d.snapshot()["nvml"]["last_poll_ts"].as_f64().unwrap();
    d.wait_for(Duration::from_secs(60), "polls past the grace", || {
        d.snapshot()["nvml"]["last_poll_ts"].as_f64().unwrap() - first >= PAST_GRACE
    });
    d
}

#[test]
fn the_readme_s_fake_daemon_raises_no_orphaned_memory_and_says_it_is_fake() {
    let d = past_the_grace(&scenario("two_gpus"));
    let found = orphans(&d);
    assert!(found.is_empty(), "{found:#?}");
    let s = d.snapshot();
    let id = s["nvml"]["simulated"].as_str().unwrap_or_default();
    assert_eq!(id, "fake-nvml 0.1.0; pids: scenario", "{:#}", s["nvml"]);
    assert_eq!(s["host_pids"], "simulated");
    assert!(
        d.log_contains("the NVML library is a fake one"),
        "{:#?}",
        d.logs.lock().unwrap()
    );
    assert!(!d.metrics().contains("gpumon_orphaned_memory_bytes{"));

    // The baseline: the same processes declared as this host's are pids that exited.
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("two_gpus_host.toml");
    let text = std::fs::read_to_string(scenario("two_gpus")).unwrap();
    std::fs::write(&host, format!("host_pids = true\n{text}")).unwrap();
    let d = past_the_grace(&host);
    assert!(d.snapshot()["nvml"]["simulated"]
        .as_str()
        .is_some_and(|s| s.ends_with("pids: host")));
    let gone: Vec<i64> = [4242, 4243, 5000, 5001]
        .into_iter()
        .filter(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .collect();
    if std::fs::read_link("/proc/self/ns/pid").unwrap().to_str() == Some("pid:[4026531836]") {
        d.wait_for(
            Duration::from_secs(30),
            "orphans of the host's pids",
            || {
                let found = orphans(&d);
                gone.iter().all(|p| found.iter().any(|f| f["pid"] == *p))
            },
        );
    }
}
