//! `--record-dir` traces, and a session joined to its NVML process entry by (host pid, GPU UUID).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

const GPU1: &str = "GPU-66666666-7777-8888-9999-000000000000";

fn push(d: &Daemon, lines: &[String]) -> BufReader<UnixStream> {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for l in lines {
        s.write_all(l.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
    }
    BufReader::new(s)
}

fn hello(ns_pid: u32) -> String {
    format!(
        r#"{{"type":"hello","v":1,"pid":{ns_pid},"job":"ft/llama","rank":1,"gpu_uuid":"{GPU1}"}}"#
    )
}

fn sample(step: u64) -> String {
    format!(
        r#"{{"type":"sample","ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":{}}}}}"#,
        1_763_700_000 + step,
        1000 + step
    )
}

#[test]
fn record_dir_writes_each_session_as_a_replayable_trace() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec![
            "--record-dir".into(),
            dir.path().to_str().unwrap().into(),
        ]),
        ..DaemonOpts::default()
    });
    let mut lines = vec![sample(0), hello(7)];
    lines.extend((1..=5).map(sample));
    lines.push("not json".into());
    lines.push(r#"{"type":"event","ts":1763700006,"kind":"mark","detail":"x"}"#.into());
    lines.push(r#"{"type":"bye","ts":1763700007}"#.into());
    let mut r = push(&d, &lines);
    r.get_ref().shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = String::new();
    // no_hello, welcome, bad_json; then EOF once the daemon has read everything.
    while r.read_line(&mut got).unwrap() > 0 {}
    assert!(got.contains(r#""code":"no_hello""#) && got.contains(r#""code":"bad_json""#));
    // The recorder thread writes the trace once the session ends; wait for the bye to land.
    let trace_files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_str().unwrap().ends_with(".trace.jsonl"))
            .collect()
    };
    d.wait_for(Duration::from_secs(5), "the trace written", || {
        trace_files()
            .first()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .is_some_and(|t| t.contains(r#""type":"bye""#))
    });
    let files = trace_files();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("gpumon-") && name.ends_with("-1-ft_llama-r1.trace.jsonl"),
        "{name}"
    );
    let trace = std::fs::read_to_string(&files[0]).unwrap();
    let expected: Vec<&String> = lines[1..7].iter().chain(&lines[8..]).collect();
    let recorded: Vec<&str> = trace.lines().collect();
    // The header: the hello, then the recorder's notes of the uid the socket gave (never the
    // client's word) and of the node it records on.
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert!(
        recorded[1].starts_with(&format!(r#"{{"type":"trace_peer","uid":{uid},"#)),
        "{}",
        recorded[1]
    );
    assert!(
        recorded[2].starts_with(r#"{"type":"trace_host","host":""#),
        "{}",
        recorded[2]
    );
    let trainer: Vec<&str> = recorded
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1 && *i != 2)
        .map(|(_, l)| *l)
        .collect();
    assert_eq!(
        trainer, expected,
        "accepted lines only, as received, hello first"
    );
    assert_eq!(d.stop().code(), Some(0));
}

#[test]
fn a_session_joins_the_nvml_process_with_its_host_pid_and_shows_both_pids() {
    // The test process itself is the trainer: the fake NVML lists our pid on GPU 1.
    let me = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    let mut scen = std::fs::read_to_string(scenario("two_gpus")).unwrap();
    scen.push_str(&format!(
        "\n[[gpu.process]]\npid = {me}\nname = \"python\"\nused = 3221225472\n"
    ));
    let path = dir.path().join("with_me.toml");
    std::fs::write(&path, scen).unwrap();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&path),
        ..DaemonOpts::default()
    });
    // A container pid (17) that is not the host pid, as a trainer in a container would send.
    let mut r = push(&d, &[hello(17), sample(1)]);
    let mut welcome = String::new();
    r.read_line(&mut welcome).unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    d.wait_for(Duration::from_secs(5), "session joined to NVML", || {
        let snap = d.snapshot();
        snap["sessions"][0]["nvml"]["used_memory_bytes"].as_u64() == Some(3221225472)
    });
    let snap = d.snapshot();
    let sess = &snap["sessions"][0];
    assert_eq!(sess["pid"].as_u64(), Some(u64::from(me)));
    assert_eq!(sess["ns_pid"].as_u64(), Some(17));
    assert_eq!(sess["gpu"].as_u64(), Some(1));
    let procs = snap["processes"].as_array().unwrap();
    let mine = procs
        .iter()
        .find(|p| p["pid"].as_u64() == Some(u64::from(me)))
        .unwrap();
    assert_eq!(common::plain_id(mine["session"].as_str().unwrap()), "s-1");
    assert_eq!(mine["ns_pid"].as_u64(), Some(17));
    // Another process on the same GPU is not joined.
    let other = procs.iter().find(|p| p["pid"] == 5000).unwrap();
    assert!(other.get("session").is_none());
    drop(r);
    assert_eq!(d.stop().code(), Some(0));
}
