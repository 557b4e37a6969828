//! The monitoring stack an operations test runs on loopback: `gpumon demo` nodes, a real
//! Prometheus, a real Alertmanager and a webhook receiver. Every child is stopped on drop.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod shipped;

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");
/// Lines of each child's output kept for failure messages.
const TAIL: usize = 30;

/// A child process whose output is kept for failure messages.
pub struct Proc {
    pub name: String,
    child: Child,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Proc {
    /// Spawns `cmd` with piped output; the receiver gets its stdout lines.
    pub fn spawn(name: &str, mut cmd: Command) -> (Proc, Receiver<String>) {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let sink = log.clone();
        // Drained to the end, or a child writing later would block or fail on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                keep(&sink, &line);
                let _ = tx.send(line);
            }
        });
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                keep(&sink, &line);
            }
        });
        let p = Proc {
            name: name.to_string(),
            child,
            log,
        };
        (p, rx)
    }

    pub fn tail(&self) -> String {
        let log = self.log.lock().unwrap();
        let lines: Vec<&str> = log.iter().map(String::as_str).collect();
        format!(
            "--- {} (last {} lines) ---\n{}",
            self.name,
            TAIL,
            lines.join("\n")
        )
    }
}

fn keep(log: &Mutex<VecDeque<String>>, line: &str) {
    let mut log = log.lock().unwrap();
    if log.len() == TAIL {
        log.pop_front();
    }
    log.push_back(line.to_string());
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first: the demo then stops its trainer children and removes its scratch dir.
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// (status, body) of a GET with query parameters; an unreachable server is status 0.
pub fn get(url: &str, params: &[(&str, &str)]) -> (u16, String) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .new_agent();
    let mut req = agent.get(url);
    for (k, v) in params {
        req = req.query(*k, *v);
    }
    match req.call() {
        Ok(mut resp) => (
            resp.status().as_u16(),
            resp.body_mut().read_to_string().unwrap_or_default(),
        ),
        Err(e) => (0, e.to_string()),
    }
}

/// Waits for `url` to answer 200, or panics naming `what`.
pub fn wait_ready(url: &str, what: &str, proc: &Proc, timeout: Duration) {
    let until = Instant::now() + timeout;
    loop {
        let (code, body) = get(url, &[]);
        if code == 200 {
            return;
        }
        assert!(
            Instant::now() < until,
            "{what} not ready after {timeout:?} at {url}: {code} {body}\n{}",
            proc.tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One simulated node: `gpumon demo --headless` with its own port and socket.
pub struct DemoNode {
    pub proc: Proc,
    /// http://127.0.0.1:PORT
    pub url: String,
    /// 127.0.0.1:PORT, what Prometheus calls the node (`instance`).
    pub target: String,
}

pub fn start_demo(name: &str, socket: &Path) -> DemoNode {
    let mut cmd = Command::new(BIN);
    cmd.args(["demo", "--headless", "--listen", "127.0.0.1:0", "--socket"])
        .arg(socket);
    // No system config and no GPUMON_* setting from the caller's environment (an Alertmanager
    // URL there would add the daemon's own alerts to the ones under test).
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUMON_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("GPUMON_CONFIG", "/dev/null");
    let (proc, lines) = Proc::spawn(name, cmd);
    let first = || {
        lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{name} printed no URL and socket\n{}", proc.tail()))
    };
    let url_line = first();
    let socket_line = first();
    let url = url_line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("{name}: no URL on the first line: {url_line:?}"))
        .to_string();
    assert_eq!(
        socket_line,
        format!("socket: {}", socket.display()),
        "{name}: second line"
    );
    let target = url.trim_start_matches("http://").to_string();
    DemoNode { proc, url, target }
}

pub fn start_alertmanager(bin: &Path, dir: &Path, webhook: &str) -> (Proc, String) {
    // group_wait and group_interval short so a new alert goes out at once; grouped the way
    // dashboards/README.md recommends.
    let config = format!(
        "route:\n  receiver: hook\n  group_by: [alertname, instance, job]\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: hook\n    webhook_configs:\n      - url: {webhook}\n        send_resolved: false\n"
    );
    alertmanager_with(bin, dir, &config, Duration::from_secs(20))
}

/// A real Alertmanager on `config`, ready within `wait`, and its URL.
pub fn alertmanager_with(bin: &Path, dir: &Path, config: &str, wait: Duration) -> (Proc, String) {
    let cfg = dir.join("alertmanager.yml");
    std::fs::write(&cfg, config).unwrap();
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=");
    let (proc, _) = Proc::spawn("alertmanager", cmd);
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&format!("{url}/-/ready"), "alertmanager", &proc, wait);
    (proc, url)
}

/// How Prometheus scrapes gpumon: gpumon's series carry no label Prometheus sets on a target
/// (`job`, `instance`), so the shipped rules work with the defaults, written out or not.
#[derive(Clone, Copy, Debug)]
pub enum Scrape {
    /// No honor_labels line: Prometheus's default.
    Default,
    /// `honor_labels: false`, written out.
    HonorLabelsFalse,
}

/// Prometheus scraping `targets` every second as `scrape` says, in the scrape job `gpumon`,
/// evaluating `rules` every second, alerting to `alertmanager` (host:port).
pub fn start_prometheus(
    bin: &Path,
    dir: &Path,
    targets: &[&str],
    rules: &str,
    alertmanager: &str,
    scrape: Scrape,
) -> (Proc, String) {
    std::fs::write(dir.join("gpumon.rules.yml"), rules).unwrap();
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nalerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{alertmanager}']\nrule_files:\n  - gpumon.rules.yml\nscrape_configs:\n  - job_name: gpumon\n{honor}    static_configs:\n      - targets: [{}]\n",
            targets.join(", "),
            honor = match scrape {
                Scrape::Default => "",
                Scrape::HonorLabelsFalse => "    honor_labels: false\n",
            }
        ),
    )
    .unwrap();
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("prom-data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        // Alerts link back here (generatorURL) rather than to the host name.
        .arg(format!("--web.external-url=http://127.0.0.1:{port}"));
    let (proc, _) = Proc::spawn("prometheus", cmd);
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(
        &format!("{url}/-/ready"),
        "prometheus",
        &proc,
        Duration::from_secs(30),
    );
    (proc, url)
}

/// A minimal HTTP receiver that keeps every request body as JSON.
pub fn webhook() -> (String, Arc<Mutex<Vec<Value>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let sink = bodies.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut len = 0;
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let v = serde_json::from_slice(&body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
            sink.lock().unwrap().push(v);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, bodies)
}

/// The instant vector of a PromQL query, or Prometheus's error.
pub fn query(prom: &str, expr: &str) -> Result<Vec<Value>, String> {
    let (code, body) = get(&format!("{prom}/api/v1/query"), &[("query", expr)]);
    let v: Value = serde_json::from_str(&body).map_err(|_| format!("HTTP {code}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("HTTP {code}: {}", v["error"]));
    }
    match v["data"]["resultType"].as_str() {
        Some("vector") | Some("matrix") => Ok(v["data"]["result"].as_array().unwrap().clone()),
        // A scalar or string is one value.
        _ => Ok(vec![v["data"]["result"].clone()]),
    }
}

/// A sample's value.
pub fn value(sample: &Value) -> f64 {
    sample["value"][1].as_str().unwrap().parse().unwrap()
}
