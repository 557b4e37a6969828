//! A live leaking session raises a finding that a real Alertmanager lists, and a webhook gets;
//! after `bye` the alert resolves. Healthy sessions raise nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod stack;
mod tools;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const GIB: u64 = 1 << 30;
const TOTAL: u64 = 85_520_809_984;

struct Alertmanager {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_alertmanager() -> Option<Alertmanager> {
    let bin = tools::find("prometheus-alertmanager", "prometheus-alertmanager")?;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("am.yml");
    std::fs::write(
        &cfg,
        "route:\n  receiver: none\n  group_wait: 1s\nreceivers:\n  - name: none\n",
    )
    .unwrap();
    let port = stack::free_port();
    let child = Command::new(bin)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let am = Alertmanager {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let addr = format!("127.0.0.1:{port}");
    while std::net::TcpStream::connect(&addr).is_err()
        || get(&format!("{}/-/ready", am.url)).0 != 200
    {
        assert!(
            std::time::Instant::now() < deadline,
            "alertmanager not ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(am)
}

fn push_session(d: &Daemon, job: &str, leak_per_step: u64, steps: u64) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    let mut buf = format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":3,\"job\":\"{job}\",\"rank\":0,\"gpu_uuid\":\"GPU-11111111-2222-3333-4444-555555555555\"}}\n"
    );
    for step in 0..steps {
        let floor = 20 * GIB + step * leak_per_step + (step * 7919 % 31) * (1 << 20);
        let peak = floor + 8 * GIB;
        let reserved = peak + GIB;
        buf.push_str(&format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{floor},\"allocated_bytes.all.peak\":{peak},\"reserved_bytes.all.current\":{reserved}}},\"device_free\":{},\"device_total\":{TOTAL}}}\n",
            1_763_700_000.0 + step as f64 * 0.5,
            TOTAL - reserved - GIB
        ));
    }
    s.write_all(buf.as_bytes()).unwrap();
    s
}

fn am_alerts(am: &Alertmanager) -> Vec<serde_json::Value> {
    let (code, body) = get(&format!("{}/api/v2/alerts", am.url));
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<Vec<serde_json::Value>>(&body).unwrap()
}

#[test]
fn a_live_leak_reaches_alertmanager_and_the_webhook_and_resolves_after_bye() {
    let Some(am) = start_alertmanager() else {
        return;
    };
    let (hook, bodies) = stack::webhook();
    let two_gpus = scenario("two_gpus");
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&two_gpus),
        args: vec![
            "--interval".into(),
            "100ms".into(),
            "--alertmanager-url".into(),
            am.url.clone(),
            "--webhook-url".into(),
            hook,
        ],
        ..DaemonOpts::default()
    });
    let mut leaky = push_session(&d, "leaky", 8 << 20, 1500);
    let _healthy = push_session(&d, "healthy", 0, 1500);

    d.wait_for(
        Duration::from_secs(20),
        "Alertmanager lists the leak",
        || {
            am_alerts(&am)
                .iter()
                .any(|a| a["labels"]["alertname"] == "GpumonLeak")
        },
    );
    let alerts = am_alerts(&am);
    assert_eq!(
        alerts.len(),
        1,
        "only the leaking session alerts: {alerts:?}"
    );
    let a = &alerts[0];
    assert_eq!(a["labels"]["job"], "leaky");
    assert_eq!(a["labels"]["gpu"], "0");
    assert_eq!(a["labels"]["severity"], "warning");
    assert_eq!(a["status"]["state"], "active");
    assert!(
        a["annotations"]["summary"]
            .as_str()
            .unwrap()
            .starts_with("allocated floor grows "),
        "{a}"
    );

    // The same finding in /metrics and the API.
    let m = d.metrics();
    assert!(m.contains("gpumon_leak_suspected{gpu=\"0\""), "{m}");
    assert_eq!(
        sample(&m, "gpumon_findings_total{kind=\"leak\"}"),
        Some(1.0)
    );
    let snap = d.snapshot();
    let f = &snap["findings"][0];
    assert_eq!(
        (f["kind"].as_str(), f["state"].as_str()),
        (Some("leak"), Some("firing"))
    );
    assert_eq!(f["job"], "leaky");
    assert!(f["evidence"]["oom_eta_seconds"].as_f64().unwrap() > 0.0);
    let slope = f["evidence"]["slope_bytes_per_step"].as_f64().unwrap();
    assert!(
        (slope / (8 << 20) as f64 - 1.0).abs() < 0.1,
        "slope {slope}"
    );

    leaky
        .write_all(b"{\"type\":\"bye\",\"ts\":1763701000}\n")
        .unwrap();
    d.wait_for(
        Duration::from_secs(20),
        "the alert resolves after bye",
        || {
            !am_alerts(&am).iter().any(|a| {
                a["labels"]["alertname"] == "GpumonLeak" && a["status"]["state"] == "active"
            })
        },
    );
    d.wait_for(
        Duration::from_secs(10),
        "the webhook saw firing and resolved",
        || {
            let states: Vec<String> = bodies
                .lock()
                .unwrap()
                .iter()
                .flat_map(|v| {
                    v["findings"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|f| format!("{}:{}", f["id"], f["state"]))
                        .collect::<Vec<_>>()
                })
                .collect();
            states == ["\"s-1/leak\":\"firing\"", "\"s-1/leak\":\"resolved\""]
        },
    );
    let snap = d.snapshot();
    assert_eq!(snap["findings"][0]["state"], "resolved");
    assert_eq!(d.stop().code(), Some(0));
}
