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
        args: DaemonOpts::default_args_and(vec![
            "--record-dir".into(),
            dir.to_str().unwrap().into(),
        ]),
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

/// A client with `ack` and an `instance`: hello, then samples `from..=to` numbered by step.
fn acking_client(d: &Daemon, from: u64, to: u64, t0: f64) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(
        s,
        r#"{{"type":"hello","v":1,"pid":1,"job":"ft","instance":"1-abcdef012345","caps":["ack"]}}"#
    )
    .unwrap();
    let mut welcome = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    for step in from..=to {
        writeln!(
            s,
            r#"{{"type":"sample","seq":{step},"ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":1073741824,"reserved_bytes.all.current":2147483648}}}}"#,
            t0 + step as f64
        )
        .unwrap();
    }
    s
}

/// A daemon restart splits a run in two traces; the second names the first, and `gpumon
/// analyze DIR` reads them as one run: no crash, every step once though the client resent the
/// lines the old daemon had not acknowledged.
#[test]
fn a_run_across_a_daemon_restart_is_one_run_with_resent_lines_counted_once() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - 100.0;
    let mut d = start(dir.path());
    let _c = acking_client(&d, 1, 30, t0);
    d.wait_for(Duration::from_secs(5), "step 30", || {
        d.snapshot()["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["step"] == 30))
    });
    let first = recorded_trace(dir.path());
    assert!(d
        .signal_and_wait(libc::SIGTERM, Duration::from_secs(10))
        .is_some_and(|s| s.success()));

    // The client resends steps 21..30 (not acknowledged, as far as it knows), then goes on.
    let d = start(dir.path());
    let mut c = acking_client(&d, 21, 50, t0);
    writeln!(c, r#"{{"type":"bye","ts":{}}}"#, t0 + 51.0).unwrap();
    drop(c);
    d.wait_for(Duration::from_secs(5), "the second session ended", || {
        sample(&d.metrics(), "gpumon_ingest_connections") == Some(0.0)
    });
    drop(d);
    let second: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl") && *p != first)
        .collect();
    assert_eq!(second.len(), 1, "{second:?}");
    let text = std::fs::read_to_string(&second[0]).unwrap();
    // After the header (the hello, then the recorder's `trace_peer` and `trace_host`).
    let link: serde_json::Value = serde_json::from_str(text.lines().nth(3).unwrap()).unwrap();
    assert_eq!(link["type"], "trace_resumes", "{text}");
    assert_eq!(
        link["file"].as_str(),
        first.file_name().unwrap().to_str(),
        "{text}"
    );

    let (code, report) = analyze(dir.path());
    assert_eq!(code, Some(0), "{report}");
    let traces = report["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 1, "{report}");
    let run = &traces[0];
    assert_eq!(run["file"], first.display().to_string());
    assert_eq!(run["continued_in"][0], second[0].display().to_string());
    assert_eq!(run["samples"], 50, "{report}");
    assert_eq!(run["duplicates"], 10, "{report}");
    assert!(run.get("ended").is_none(), "{report}");
    assert!(!kinds(&report).contains(&"crash".to_string()), "{report}");

    // Read alone, the second trace is a run of its own that began with a resent step.
    let (_, alone) = analyze(&second[0]);
    assert_eq!(alone["traces"][0]["samples"], 30, "{alone}");
    let out = Command::new(BIN)
        .arg("analyze")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("continued in") && text.contains("10 resent line(s)"),
        "{text}"
    );
}

/// A daemon killed outright writes no end on the traces it was writing; the next one, started
/// on the same directory, ends them (`daemon_killed`), so they do not read as crashes. A
/// trainer that closed without bye before the kill still reads as one.
#[test]
fn a_killed_daemon_s_open_traces_are_ended_by_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start(dir.path());
    let crashed = trainer(&d, 3);
    d.wait_for(Duration::from_secs(5), "the first session", || {
        d.snapshot()["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["step"] == 3))
    });
    let crashed_trace = recorded_trace(dir.path());
    drop(crashed);
    d.wait_for(Duration::from_secs(5), "the crash", || {
        sample(&d.metrics(), "gpumon_findings_total{kind=\"crash\"}") == Some(1.0)
    });
    let _alive = trainer(&d, 5);
    d.wait_for(Duration::from_secs(5), "the second session", || {
        d.snapshot()["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["step"] == 5))
    });
    let open_trace = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl") && *p != crashed_trace)
        .unwrap();
    // Lines wait up to a second for company before they go to the file: one more, later,
    // takes them all there.
    std::thread::sleep(Duration::from_millis(1100));
    writeln!(
        &_alive,
        r#"{{"type":"sample","ts":{},"step":6,"stats":{{"allocated_bytes.all.current":1073741824}}}}"#,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    )
    .unwrap();
    d.wait_for(Duration::from_secs(5), "the samples on disk", || {
        std::fs::read_to_string(&open_trace)
            .unwrap()
            .lines()
            .count()
            >= 7
    });
    d.signal_and_wait(libc::SIGKILL, Duration::from_secs(10))
        .unwrap();
    // Killed: nothing marks the end yet.
    assert!(!std::fs::read_to_string(&open_trace)
        .unwrap()
        .contains("trace_end"));

    let d = start(dir.path());
    let (code, report) = analyze(&open_trace);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["traces"][0]["ended"], "daemon_killed", "{report}");
    assert_eq!(report["traces"][0]["samples"], 6);
    let (code, report) = analyze(&crashed_trace);
    assert_eq!(code, Some(1), "{report}");
    assert!(kinds(&report).contains(&"crash".to_string()), "{report}");
    assert!(d.log_contains("daemon_killed"));
}
