//! A trainer on a MIG instance: /metrics, the session and finding in the JSON API, and the
//! webhook alert all name the same GPU (the MIG device's parent, by NVML index), because the
//! join is made once, by the aggregator, with the MIG devices in view.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod stack;
mod tools;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

/// The scenario's first MIG instance, on GPU 0.
const MIG: &str = "MIG-11111111-0000-4000-8000-000000000000";

#[test]
fn a_trainer_on_a_mig_instance_has_one_gpu_in_every_output() {
    let (hook, bodies) = stack::webhook();
    let mig = scenario("mig");
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&mig),
        args: vec![
            "--interval".into(),
            "100ms".into(),
            "--webhook-url".into(),
            hook,
        ],
        ..DaemonOpts::default()
    });
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(
        s,
        r#"{{"type":"hello","v":1,"pid":1,"job":"mig","rank":0,"gpu_uuid":"{MIG}"}}"#
    )
    .unwrap();
    let mut welcome = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    writeln!(
        s,
        r#"{{"type":"sample","ts":1763700000,"step":1,"stats":{{"allocated_bytes.all.current":1000,"reserved_bytes.all.current":4000}}}}"#
    )
    .unwrap();
    let labels = format!(r#"{{gpu="0",uuid="{MIG}","#);
    d.wait_for(Duration::from_secs(10), "the trainer in /metrics", || {
        d.metrics()
            .lines()
            .any(|l| l.starts_with(&format!("gpumon_trainer_allocated_bytes{labels}")))
    });
    let m = d.metrics();
    assert!(
        m.lines()
            .any(|l| l.starts_with(&format!("gpumon_trainer_info{labels}"))),
        "{m}"
    );
    let snap = d.snapshot();
    let session = &snap["sessions"][0];
    assert_eq!(session["gpu"], 0, "{session}");
    // One fragmentation: the metric and what the TUI and status compute from the API's stats.
    let typed: gpumon::core::snapshot::Snapshot = serde_json::from_value(snap.clone()).unwrap();
    let frag = typed.sessions[0].stats.unwrap().fragmentation().unwrap();
    assert_eq!(frag, 0.75);
    let metric = m
        .lines()
        .find_map(|l| l.strip_prefix(&format!("gpumon_fragmentation_ratio{labels}")))
        .and_then(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(metric, Some(frag), "{m}");
    // The trainer vanishes without bye: a crash finding, about the same GPU everywhere.
    drop(s);
    d.wait_for(Duration::from_secs(10), "the crash finding", || {
        d.snapshot()["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "crash")
    });
    let snap = d.snapshot();
    let crash = snap["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "crash")
        .unwrap()
        .clone();
    assert_eq!(crash["gpu"], "0", "{crash}");
    assert_eq!(crash["gpu_uuid"], MIG, "{crash}");
    d.wait_for(Duration::from_secs(10), "the webhook", || {
        !bodies.lock().unwrap().is_empty()
    });
    let body = bodies.lock().unwrap()[0].clone();
    let sent = body["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "crash")
        .unwrap_or_else(|| panic!("{body}"))
        .clone();
    assert_eq!(sent["gpu"], "0", "{sent}");
    assert!(d
        .metrics()
        .lines()
        .any(|l| l == r#"gpumon_findings_firing{kind="crash"} 1"#),);
}
