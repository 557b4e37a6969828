//! Runs the real `gpumon` binary against the fake NVML library, over real HTTP.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_gpumon");

pub fn fake_lib() -> PathBuf {
    fake_nvml::harness::library_path()
}

pub fn scenario(name: &str) -> PathBuf {
    fake_nvml::harness::scenario_path(name)
}

/// An empty config file, so a machine's /etc/gpumon/gpumon.toml cannot leak into a test.
pub fn empty_config() -> tempfile::NamedTempFile {
    tempfile::NamedTempFile::new().unwrap()
}

pub struct Daemon {
    child: Child,
    pub addr: SocketAddr,
    pub logs: Arc<Mutex<Vec<String>>>,
    pub socket: PathBuf,
    _config: tempfile::NamedTempFile,
    _dir: tempfile::TempDir,
}

pub struct DaemonOpts<'a> {
    pub scenario: Option<&'a Path>,
    pub nvml_lib: Option<PathBuf>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// TOML for the config file (empty: every default).
    pub config: String,
}

impl Default for DaemonOpts<'_> {
    fn default() -> Self {
        Self {
            scenario: None,
            nvml_lib: None,
            args: vec!["--interval".into(), "100ms".into()],
            env: vec![],
            config: String::new(),
        }
    }
}

impl DaemonOpts<'_> {
    /// The default arguments (a 100 ms poll) followed by `extra`.
    pub fn default_args_and(extra: Vec<String>) -> Vec<String> {
        let mut args = Self::default().args;
        args.extend(extra);
        args
    }
}

impl Daemon {
    pub fn with_scenario(name: &str) -> Self {
        let path = scenario(name);
        Self::start(DaemonOpts {
            scenario: Some(&path),
            ..DaemonOpts::default()
        })
    }

    pub fn start(opts: DaemonOpts) -> Self {
        let config = empty_config();
        std::fs::write(config.path(), &opts.config).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ingest.sock");
        let lib = opts.nvml_lib.unwrap_or_else(fake_lib);
        let mut cmd = Command::new(BIN);
        cmd.args([
            "--config",
            config.path().to_str().unwrap(),
            "--log-format",
            "json",
        ])
        .args(["daemon", "--listen", "127.0.0.1:0", "--nvml-lib"])
        .arg(&lib)
        .arg("--socket")
        .arg(&socket)
        .args(&opts.args)
        .env_remove("GPUMON_LISTEN")
        .env_remove("GPUMON_INTERVAL")
        .env("GPUMON_LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        if let Some(s) = opts.scenario {
            cmd.env("FAKE_NVML_SCENARIO", s);
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn gpumon");
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let addr = listen_addr(&line);
                // Recorded before the address goes out: a test that starts on it may look for
                // this very line at once.
                sink.lock().unwrap().push(line);
                if let Some(addr) = addr {
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("daemon did not start: {:?}", logs.lock().unwrap()));
        let d = Self {
            child,
            addr,
            logs,
            socket,
            _config: config,
            _dir: dir,
        };
        d.wait_for(Duration::from_secs(10), "first poll", || {
            d.get("/readyz").0 == 200
        });
        d
    }

    /// The daemon's pid, e.g. to read its /proc/<pid>/status.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// (status, body) of a GET.
    pub fn get(&self, path: &str) -> (u16, String) {
        get(&self.url(path))
    }

    pub fn metrics(&self) -> String {
        let (code, body) = self.get("/metrics");
        assert_eq!(code, 200);
        body
    }

    pub fn snapshot(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/api/v1/snapshot").1).unwrap()
    }

    pub fn wait_for(&self, timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if cond() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "timed out waiting for {what}; logs: {:#?}",
            self.logs.lock().unwrap()
        );
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// SIGTERM, then the exit status (must come within 10 s: graceful shutdown drains tasks).
    pub fn stop(mut self) -> ExitStatus {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "daemon ignored SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Daemon {
    /// Sends `signal` and waits up to `timeout` for the exit: the status, or None while it runs.
    pub fn signal_and_wait(&mut self, signal: i32, timeout: Duration) -> Option<ExitStatus> {
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listen_addr(line: &str) -> Option<SocketAddr> {
    // The fake library writes to the same stderr from another thread, so a log line can arrive
    // after a fragment of its message: parse from the first brace.
    let v: serde_json::Value = serde_json::from_str(&line[line.find('{')?..]).ok()?;
    let fields = v.get("fields")?;
    if fields.get("message")?.as_str()? != "gpumon daemon serving" {
        return None;
    }
    fields.get("listen")?.as_str()?.parse().ok()
}

pub fn get(url: &str) -> (u16, String) {
    try_get(url).unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// `get`, or why no HTTP answer came (refused, reset, timed out).
pub fn try_get(url: &str) -> Result<(u16, String), String> {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .new_agent();
    let mut resp = agent.get(url).call().map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok((code, body))
}

/// The value of the one sample line that starts with `series` (name plus labels, exactly).
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        rest.strip_prefix(' ')?.parse().ok()
    })
}

pub fn count_series(metrics: &str, name: &str) -> usize {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .count()
}

/// Runs `promtool check metrics` on the text; promtool is required (scripts/check installs it).
pub fn promtool_check(metrics: &str) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "promtool not found: install it with `apt-get install prometheus` (scripts/check does)",
        );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A daemon's session id (`s-<start>-<n>`, optionally `/kind`) without its start-time part:
/// `s-mi8dfxmo-1/leak` → `s-1/leak`, so tests can name the first session of a daemon.
pub fn plain_id(id: &str) -> String {
    match id.strip_prefix("s-").and_then(|rest| rest.split_once('-')) {
        Some((start, n)) if start.chars().all(|c| c.is_ascii_alphanumeric()) => format!("s-{n}"),
        _ => id.to_owned(),
    }
}

/// A trace file the daemon recorded in `dir` (the first one listed).
pub fn recorded_trace(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".trace.jsonl"))
        .expect("a recorded trace")
}

/// `gpumon analyze --format json TRACE`: its exit code and its report.
pub fn analyze_json(trace: &Path) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(BIN)
        .args(["analyze", "--format", "json"])
        .arg(trace)
        .output()
        .unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

/// The kinds of the findings of an analyze report's first trace, in order.
pub fn kinds(report: &serde_json::Value) -> Vec<String> {
    report["traces"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Runs `start` (a spawn or output of a freshly copied binary) again while exec says "text file
/// busy": a fork in another test thread may briefly hold the copy's write descriptor open, the
/// race every program that writes then executes a file meets.
pub fn retry_busy<T>(mut start: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match start() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}
