//! A trainer on a MIG instance: /metrics, the session and finding in the JSON API, the TUI's
//! row, the webhook, a real Alertmanager's labels and `gpumon analyze` of the recorded trace all
//! name the same GPU (the MIG device's parent, by NVML index) and the same fragmentation,
//! because the join is made once, in the core, with the MIG devices in view.
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
    let dir = tempfile::tempdir().unwrap();
    // Only the Alertmanager part is skipped where the tool is missing (never under
    // GPUMON_REQUIRE_TOOLS); every other output is checked anyway.
    let am = tools::find("prometheus-alertmanager", "prometheus-alertmanager")
        .map(|bin| stack::start_alertmanager(&bin, dir.path(), "http://127.0.0.1:9/"));
    let traces = dir.path().join("traces");
    let mut args: Vec<String> = vec!["--record-dir".into(), traces.display().to_string()];
    if let Some((_, url)) = &am {
        args.extend(["--alertmanager-url".into(), url.clone()]);
    }
    let mig = scenario("mig");
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&mig),
        args: DaemonOpts::default_args_and(vec!["--webhook-url".into(), hook])
            .into_iter()
            .chain(args)
            .collect(),
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
    // The TUI's row, built from the same document as the TUI reads it.
    let mut node = gpumon::frontends::tui::app::node::Node::new(
        gpumon::frontends::tui::app::node::Origin::Daemon { url: d.url("") },
    );
    node.absorb(typed);
    let rows = gpumon::frontends::tui::app::rows::build(std::slice::from_ref(&node));
    let row = rows
        .iter()
        .find(|r| r.key.session.is_some())
        .expect("the trainer's row");
    assert_eq!(row.key.gpu, Some(0));
    assert_eq!(row.frag, Some(frag));
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
    if let Some((_, am_url)) = &am {
        d.wait_for(Duration::from_secs(20), "the alert in Alertmanager", || {
            let (_, body) = get(&format!("{am_url}/api/v2/alerts"));
            body.contains("GpumonTrainerCrash")
        });
        let (_, body) = get(&format!("{am_url}/api/v2/alerts"));
        let alerts: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        let labels = &alerts[0]["labels"];
        let got = (&labels["gpu"], &labels["uuid"]);
        assert_eq!(got, (&"0".into(), &MIG.into()), "{body}");
    }
    assert!(d
        .metrics()
        .lines()
        .any(|l| l == r#"gpumon_findings_firing{kind="crash"} 1"#),);
    // Offline: the recorded trace, replayed, names the GPU the daemon did.
    assert_eq!(d.stop().code(), Some(0));
    let (_, report) = analyze_json(&recorded_trace(&traces));
    let t = &report["traces"][0];
    assert_eq!(t["gpu"], "0", "{report}");
    let found = t["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "crash")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(
        (&found["gpu"], &found["gpu_uuid"]),
        (&"0".into(), &MIG.into()),
        "{report}"
    );
}
