//! Traces say how they ended: a trace a running daemon still writes reads as open, one whose
//! session was open when the daemon stopped ends with the daemon's `trace_end` line, and neither
//! is read by `gpumon analyze` as a trainer that crashed; a trace that just stops (the trainer's
//! connection closed without bye) still is. `gpumon analyze DIR` reads the traces in DIR.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

fn start(dir: &Path) -> Daemon {
    Daemon::start(DaemonOpts {
        args: vec![
            "--interval".into(),
            "100ms".into(),
            "--record-dir".into(),
            dir.to_str().unwrap().into(),
        ],
        ..DaemonOpts::default()
    })
}

/// A trainer that says hello and sends `steps` samples, and never bye.
fn trainer(d: &Daemon, steps: u64) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(s, r#"{{"type":"hello","v":1,"pid":1,"job":"ft"}}"#).unwrap();
    let mut welcome = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for step in 1..=steps {
        writeln!(
            s,
            r#"{{"type":"sample","ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":1073741824,"reserved_bytes.all.current":2147483648}}}}"#,
            now - (steps - step) as f64
        )
        .unwrap();
    }
    s
}

/// `gpumon analyze --format json ARG`: exit code and report.
fn analyze(arg: &Path) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(BIN)
        .args(["analyze", "--format", "json"])
        .arg(arg)
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), report)
}

fn kinds(report: &serde_json::Value) -> Vec<String> {
    report["traces"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_daemon_stop_and_a_trace_still_written_are_not_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path());
    let _t = trainer(&d, 5);
    d.wait_for(Duration::from_secs(5), "the session", || {
        d.snapshot()["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["step"] == 5))
    });
    let trace = recorded_trace(dir.path());

    // While the daemon runs: open, and the directory reads as its traces.
    let (code, report) = analyze(dir.path());
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["traces"][0]["ended"], "open", "{report}");
    assert!(!kinds(&report).contains(&"crash".to_string()), "{report}");

    // The daemon stops with the trainer still connected: its trace says so.
    assert!(d
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    let text = std::fs::read_to_string(&trace).unwrap();
    let last = text.lines().last().unwrap();
    let end: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(
        (end["type"].as_str(), end["reason"].as_str()),
        (Some("trace_end"), Some("daemon_stopped")),
        "{last}"
    );
    let (code, report) = analyze(&trace);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["traces"][0]["ended"], "daemon_stopped");
    assert_eq!(report["traces"][0]["samples"], 5);
    let out = Command::new(BIN)
        .arg("analyze")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ended: daemon_stopped"), "{text}");

    // The same trace without the daemon's line: a connection that closed without bye.
    let cut: String = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"trace_end\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let crashed = dir.path().join("crashed.jsonl");
    std::fs::write(&crashed, cut).unwrap();
    let (code, report) = analyze(&crashed);
    assert_eq!(code, Some(1), "{report}");
    assert!(kinds(&report).contains(&"crash".to_string()), "{report}");
}

#[test]
fn an_empty_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("analyze")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&dir.path().display().to_string()) && err.contains("no trace files"),
        "{err}"
    );
}
