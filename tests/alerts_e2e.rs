//! A live leaking session raises a finding that a real Alertmanager lists, and a webhook gets;
//! after `bye` the alert resolves. Healthy sessions raise nothing. A trainer that can attribute
//! is asked where its leak allocates; its answer reaches the alert, the webhook, the API and the
//! recorded trace that `gpumon analyze` replays.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod stack;
mod tools;

use std::io::{BufRead, BufReader, Write};
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
    // Not ready until /-/ready answers 200; a refused connection in between (the listener not
    // up yet) is waited out too.
    let ready = || {
        std::net::TcpStream::connect(&addr).is_ok()
            && common::try_get(&format!("{}/-/ready", am.url)).is_ok_and(|(c, _)| c == 200)
    };
    while !ready() {
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
    let mut buf = hello(job, "");
    buf.push_str(&samples(0..steps, leak_per_step));
    s.write_all(buf.as_bytes()).unwrap();
    s
}

fn hello(job: &str, extra: &str) -> String {
    format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":3,\"job\":\"{job}\",\"rank\":0,\"gpu_uuid\":\"GPU-11111111-2222-3333-4444-555555555555\"{extra}}}\n"
    )
}

/// Step-boundary samples of a trainer whose floor grows `leak_per_step`, half a second apart.
fn samples(steps: std::ops::Range<u64>, leak_per_step: u64) -> String {
    let mut buf = String::new();
    for step in steps {
        let floor = 20 * GIB + step * leak_per_step + (step * 7919 % 31) * (1 << 20);
        let peak = floor + 8 * GIB;
        let reserved = peak + GIB;
        buf.push_str(&format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{floor},\"allocated_bytes.all.peak\":{peak},\"reserved_bytes.all.current\":{reserved}}},\"device_free\":{},\"device_total\":{TOTAL}}}\n",
            step_ts(step),
            TOTAL - reserved - GIB
        ));
    }
    buf
}

/// A tenth of a second a step: on the trainer's own clock, the one its recorded trace is
/// replayed on, it answers within the window the daemon's request gave it, as it did live.
fn step_ts(step: u64) -> f64 {
    1_763_700_000.0 + step as f64 * STEP_SECONDS
}

const STEP_SECONDS: f64 = 0.1;

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
        args: DaemonOpts::default_args_and(vec![
            "--alertmanager-url".into(),
            am.url.clone(),
            "--webhook-url".into(),
            hook,
        ]),
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
    assert_eq!(a["labels"]["job_name"], "leaky");
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
                        .map(|f| {
                            let id = common::plain_id(f["id"].as_str().unwrap_or(""));
                            format!("{id:?}:{}", f["state"])
                        })
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

const TRAIN_PY: &str = "/home/alice/proj/train.py";

/// The answer of the kept-outputs trainer (its snapshot pair's real diff: 120 MiB in 120
/// blocks at train.py:27) to request `id`, over steps `from..to`, while 160 MiB grew in all.
fn kept_outputs_answer(id: u64, from: u64, to: u64) -> String {
    let frame = |line: u64, function: &str| {
        format!(r#"{{"file":"{TRAIN_PY}","line":{line},"function":"{function}"}}"#)
    };
    format!(
        r#"{{"type":"attribution","id":{id},"ts":{},"step_from":{from},"step_to":{to},"seconds":{},"total_growth_bytes":167772160,"sites":[{{"file":"{TRAIN_PY}","line":27,"function":"kept_outputs","bytes":125829120,"blocks":120,"stack":[{},{},{}]}}]}}"#,
        step_ts(to),
        (to - from) as f64 * STEP_SECONDS,
        frame(27, "kept_outputs"),
        frame(48, "run"),
        frame(69, "<module>"),
    ) + "\n"
}

/// Daemon asks, the trainer "records" the steps it was asked for and answers; the answer's top
/// site then shows in Alertmanager's annotations, the webhook body, the snapshot's finding,
/// the session view and, replayed from the recorded trace, in `gpumon analyze`.
#[test]
fn an_attributed_leak_names_its_site_everywhere_the_finding_goes() {
    let Some(am) = start_alertmanager() else {
        return;
    };
    let (hook, bodies) = stack::webhook();
    let two_gpus = scenario("two_gpus");
    let traces = tempfile::tempdir().unwrap();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&two_gpus),
        args: DaemonOpts::default_args_and(vec![
            "--alertmanager-url".into(),
            am.url.clone(),
            "--webhook-url".into(),
            hook,
            "--record-dir".into(),
            traces.path().display().to_string(),
        ]),
        ..DaemonOpts::default()
    });
    let mut w = UnixStream::connect(&d.socket).unwrap();
    w.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(w.try_clone().unwrap());
    let leak = 8u64 << 20;
    w.write_all(hello("kept", r#","caps":["attribution"]"#).as_bytes())
        .unwrap();
    w.write_all(samples(0..1500, leak).as_bytes()).unwrap();

    // The daemon's lines: welcome, then (the leak pending or firing) the request.
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("\"welcome\""), "{line}");
    let req: serde_json::Value = loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "closed before a request"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["type"] == "attribute" {
            break v;
        }
        assert_ne!(v["type"], "error", "{line}");
    };
    let finding = req["finding"].as_str().unwrap().to_owned();
    assert_eq!(common::plain_id(&finding), "s-1/leak", "{req}");
    let (id, steps) = (req["id"].as_u64().unwrap(), req["steps"].as_u64().unwrap());
    assert!((1..=1000).contains(&steps), "{req}");

    // The window: the steps asked for go by, then the answer.
    let to = 1500 + steps;
    w.write_all(samples(1500..to, leak).as_bytes()).unwrap();
    w.write_all(kept_outputs_answer(id, 1500, to).as_bytes())
        .unwrap();
    let window = format!("steps 1,500\u{2013}1,{:03}", to - 1000);

    let expected = format!("train.py:27 in kept_outputs (75% of 160.0 MiB in {window})");
    d.wait_for(
        Duration::from_secs(20),
        "Alertmanager shows the top site",
        || {
            am_alerts(&am)
                .iter()
                .any(|a| a["annotations"]["attribution"] == expected.as_str())
        },
    );
    let alerts = am_alerts(&am);
    let a = &alerts[0];
    assert_eq!(a["labels"]["alertname"], "GpumonLeak");
    assert_eq!(
        a["annotations"]["attribution_stack"],
        "/home/alice/proj/train.py:27 in kept_outputs\n\
         /home/alice/proj/train.py:48 in run\n\
         /home/alice/proj/train.py:69 in <module>",
        "{a}"
    );
    let summary = a["annotations"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("train.py:27"),
        "the message names the site: {summary}"
    );

    // The webhook got the finding again, with the whole attribution.
    d.wait_for(
        Duration::from_secs(10),
        "the webhook body's attribution",
        || {
            bodies.lock().unwrap().iter().any(|b| {
                b["findings"].as_array().unwrap().iter().any(|f| {
                    f["id"] == finding.as_str()
                        && f["attribution"]["sites"][0]["line"] == 27
                        && f["attribution"]["sites"][0]["stack"][1]["function"] == "run"
                })
            })
        },
    );

    // The API: the finding and the session carry the sites with their stacks.
    let snap = d.snapshot();
    let f = &snap["findings"][0];
    assert_eq!(f["kind"], "leak");
    assert!(
        f["message"].as_str().unwrap().contains("train.py:27"),
        "{f}"
    );
    let site = &f["attribution"]["sites"][0];
    assert_eq!(
        (
            site["file"].as_str(),
            site["function"].as_str(),
            site["bytes"].as_u64()
        ),
        (Some(TRAIN_PY), Some("kept_outputs"), Some(125_829_120)),
        "{f}"
    );
    assert_eq!(site["stack"].as_array().unwrap().len(), 3, "{site}");
    let session = finding.trim_end_matches("/leak");
    let (code, body) = d.get(&format!("/api/v1/sessions/{session}"));
    assert_eq!(code, 200, "{body}");
    let sess: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(sess["attribution"]["step_to"], to, "{body}");
    assert_eq!(
        sess["attribution"]["sites"][0]["stack"][2]["function"],
        "<module>"
    );

    // The recorded trace keeps the answer: the replay reports the same site.
    w.write_all(b"{\"type\":\"bye\",\"ts\":1763701000}\n")
        .unwrap();
    d.wait_for(Duration::from_secs(10), "the session ends", || {
        d.snapshot()["sessions"][0]["ended"].is_array()
    });
    assert_eq!(d.stop().code(), Some(0));
    let trace = recorded_trace(traces.path());
    let out = std::process::Command::new(BIN)
        .arg("analyze")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(
            " 75%  120.0 MiB    120 blocks  /home/alice/proj/train.py:27 in kept_outputs"
        ),
        "{text}"
    );
}
