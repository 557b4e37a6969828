//! The shared list of hostile strings (tests/common/hostile.rs) through every text output a
//! person reads: `gpumon status` (its table, and its errors, which quote what answered), `gpumon
//! analyze` (its report and its errors), and the daemon's log in both formats. Nothing a
//! terminal obeys or draws as nothing reaches the output, and each string shows escaped.
//! (The TUI: tests/tui_escapes.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/hostile.rs"]
mod hostile;
#[path = "common/hostile_node.rs"]
mod hostile_node;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use gpumon::util::printable::printable;
use hostile::{first_escape, HOSTILE};
use hostile_node::{hostile_snapshot, missing, open_sessions, raw, serve};

fn gpumon(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--config", "/dev/null"])
        .args(args)
        .env_remove("GPUMON_LISTEN")
        .output()
        .unwrap()
}

#[test]
fn the_status_table_shows_every_hostile_string_escaped() {
    let addr = serve(hostile_snapshot().to_string());
    let out = gpumon(&["status", "--connect", &addr]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(raw(&out.stdout), Vec::<String>::new(), "{text}");
    assert_eq!(missing(&text), Vec::<&str>::new(), "{text}");

    // `--json` keeps the true strings, with what a terminal obeys written as JSON escapes.
    let out = gpumon(&["status", "--connect", &addr, "--json"]);
    assert_eq!(raw(&out.stdout), Vec::<String>::new());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, HOSTILE);
}

/// A snapshot whose enum (a GPU's state) holds a hostile string is refused by serde with a message that quotes
/// it: printed escaped, whether the daemon was named (`--connect`) or another user answers on
/// the port the daemon listens on while it is down (plain `gpumon status`).
#[test]
fn status_errors_quote_a_hostile_answer_escaped() {
    let mut snap = hostile_snapshot();
    for s in HOSTILE {
        snap["gpus"][0]["state"] = (*s).into();
        let addr = serve(snap.to_string());
        let shown = first_escape(&printable(s)).to_string();
        for args in [
            vec!["status", "--connect", &addr],
            vec!["status", "--listen", &addr, "--nvml-lib", "/nonexistent.so"],
        ] {
            let out = gpumon(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(!out.status.success(), "{args:?}: {err}{text}");
            assert_eq!(raw(&out.stderr), Vec::<String>::new(), "{args:?}: {err:?}");
            assert!(err.contains("unknown variant"), "{args:?}: {err}");
            assert!(err.contains(&shown), "{shown} in {args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "one line: {err}");
        }
    }
}

/// clap quotes what was typed: a bad value, an unknown argument, an unknown subcommand. Each
/// reaches the terminal escaped, on stderr, with clap's exit status.
#[test]
fn argument_errors_quote_what_was_typed_escaped() {
    // An argument cannot hold a NUL.
    for s in HOSTILE.iter().filter(|s| !s.contains('\0')) {
        let shown = first_escape(&printable(s)).to_string();
        let value = format!("127.0.0.1:{s}");
        let flag = format!("--{s}");
        for args in [
            vec!["status", "--listen", value.as_str()],
            vec!["status", flag.as_str()],
            vec![*s],
        ] {
            let out = gpumon(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert_eq!(raw(&out.stderr), Vec::<String>::new(), "{args:?}: {err:?}");
            assert!(err.contains(&shown), "{shown} in {args:?}: {err}");
        }
    }
}

#[test]
fn analyze_shows_hostile_jobs_and_paths_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec![];
    for (i, s) in HOSTILE.iter().enumerate() {
        let path = dir.path().join(format!("t{i}.jsonl"));
        let mut f = std::fs::File::create(&path).unwrap();
        let hello = serde_json::json!({"type": "hello", "v": 1, "pid": 1, "job": s, "rank": 0});
        writeln!(f, "{hello}").unwrap();
        for step in 0..5 {
            writeln!(
                f,
                r#"{{"type":"sample","ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":1073741824,"reserved_bytes.all.current":2147483648}}}}"#,
                1_763_700_000 + step
            )
            .unwrap();
        }
        writeln!(f, r#"{{"type":"bye","ts":1763700010}}"#).unwrap();
        args.push(path.into_os_string());
    }
    let out = Command::new(BIN)
        .args(["--config", "/dev/null", "analyze"])
        .args(&args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(raw(&out.stdout), Vec::<String>::new(), "{text}");
    assert_eq!(missing(&text), Vec::<&str>::new(), "{text}");
    // The JSON report keeps the true strings, nothing raw.
    let out = Command::new(BIN)
        .args(["--config", "/dev/null", "analyze", "--format", "json"])
        .args(&args)
        .output()
        .unwrap();
    assert_eq!(raw(&out.stdout), Vec::<String>::new());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut jobs: Vec<&str> = v["traces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["job"].as_str())
        .collect();
    let mut want = HOSTILE.to_vec();
    jobs.sort_unstable();
    want.sort_unstable();
    assert_eq!(jobs, want);

    // A path named by a hostile string (a file in a shared directory, a name in a script):
    // named in the error escaped. A NUL cannot be in a path.
    for s in HOSTILE.iter().filter(|s| !s.contains('\0')) {
        let path = dir.path().join("gone").join(s);
        let out = Command::new(BIN)
            .args(["--config", "/dev/null", "analyze"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(raw(&out.stderr), Vec::<String>::new(), "{err:?}");
        assert!(err.contains(first_escape(&printable(s))), "{s:?}: {err}");
    }
}

/// The JSON log keeps each job's true string, with what a terminal obeys (which serde_json
/// leaves raw: C1, bidi, invisible characters) written as `\uXXXX`.
#[test]
fn the_json_log_keeps_true_strings_and_nothing_raw() {
    let d = Daemon::with_scenario("two_gpus");
    let _sessions = open_sessions(&d.socket);
    let opened = |d: &Daemon| -> Vec<String> {
        let logs = d.logs.lock().unwrap();
        logs.iter()
            .filter(|l| l.contains("trainer session opened"))
            .cloned()
            .collect()
    };
    d.wait_for(Duration::from_secs(20), "a line per session", || {
        opened(&d).len() >= HOSTILE.len()
    });
    let lines = opened(&d);
    let jobs: Vec<String> = lines
        .iter()
        .map(|l| {
            assert_eq!(raw(l.as_bytes()), Vec::<String>::new(), "{l}");
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["fields"]["job"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(jobs, HOSTILE);
}

/// The text log: every value through the rule, as `gpumon status` shows it.
#[test]
fn the_text_log_shows_every_hostile_job_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ingest.sock");
    let mut child = Command::new(BIN)
        .args(["--config", "/dev/null", "--log-format", "text", "daemon"])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "100ms",
            "--nvml-lib",
        ])
        .arg(fake_lib())
        .arg("--socket")
        .arg(&socket)
        .env("FAKE_NVML_SCENARIO", scenario("two_gpus"))
        .env("GPUMON_LOG_LEVEL", "info")
        .env_remove("GPUMON_LOG_FORMAT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stderr);
        let mut line = Vec::new();
        while r.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            let _ = tx.send(std::mem::take(&mut line));
        }
    });
    let sessions = open_sessions(&socket);
    let mut opened = vec![];
    let deadline = Instant::now() + Duration::from_secs(30);
    while opened.len() < HOSTILE.len() && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            assert_eq!(raw(&l), Vec::<String>::new(), "{l:?}");
            let l = String::from_utf8(l).unwrap();
            if l.contains("trainer session opened") {
                opened.push(l);
            }
        }
    }
    drop(sessions);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(opened.len(), HOSTILE.len(), "{opened:#?}");
    for (s, l) in HOSTILE.iter().zip(&opened) {
        // A string field is written as Rust's Debug form, then the line through the rule.
        let shown = format!("job={}", printable(&format!("{s:?}")));
        assert!(l.contains(&shown), "{shown} in {l}");
    }
}
