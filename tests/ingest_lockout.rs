//! Connections that never say anything cannot lock trainers out of the real daemon: a hello
//! deadline, an idle timeout, and slots taken back from connections without hello.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;

const HELLO: &str = "{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"real\",\"rank\":0}\n";

fn sample_line(step: u64) -> String {
    format!(
        "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":1000}}}}\n",
        1_763_700_000 + step
    )
}

fn closed(d: &Daemon, reason: &str) -> f64 {
    let series = format!("gpumon_ingest_closed_total{{reason=\"{reason}\"}}");
    sample(&d.metrics(), &series).unwrap_or_else(|| panic!("{series} missing"))
}

/// Raises this process's open-files limit (the daemon inherits it) to hold `n` connections.
fn allow_fds(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write only the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < n {
            lim.rlim_cur = lim.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(
        lim.rlim_cur >= n,
        "this test needs {n} open files; the hard limit is {}",
        lim.rlim_max
    );
}

/// Every line the daemon sent on `s` until it closed it, as JSON.
fn said_until_closed(s: &UnixStream) -> Vec<serde_json::Value> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut all = String::new();
    (&*s).read_to_string(&mut all).unwrap();
    all.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// The one line the daemon sent on `s` before closing it.
fn last_words(s: &UnixStream) -> serde_json::Value {
    let mut said = said_until_closed(s);
    assert_eq!(said.len(), 1, "{said:?}");
    said.remove(0)
}

/// Connects and says hello; the welcome, and how long it took from connect.
fn trainer(d: &Daemon) -> (UnixStream, serde_json::Value, Duration) {
    let t = Instant::now();
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(HELLO.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    let welcome = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (s, welcome, t.elapsed())
}

#[test]
fn a_thousand_silent_connections_do_not_lock_a_trainer_out() {
    // Every default: max_connections 1024, 256 per uid, 32 reserved, a 10 s hello deadline. All
    // from this test's uid: past its 256, each new one closes that uid's oldest silent one.
    lockout("", 256, "ingest.max_connections_per_uid");
}

#[test]
fn without_a_per_uid_cap_silent_connections_still_leave_the_reserve() {
    // As if the silent ones came from many users: only the slots for connections without hello
    // (1024 - 32) bound them, and the oldest gives way.
    let config = "[ingest]\nmax_connections_per_uid = 100000\n";
    lockout(config, 1024 - 32, "ingest.reserved_connections");
}

/// 1,024 connections that never send anything, then a trainer: welcomed well before a hello deadline (10 s); `held` of
/// the silent ones are still open, the rest were told why (naming `key`), closed and counted.
fn lockout(config: &str, held: usize, key: &str) {
    const SILENT: usize = 1024;
    allow_fds(2 * SILENT as u64 + 256);
    let d = Daemon::start(DaemonOpts {
        config: config.into(),
        ..DaemonOpts::default()
    });
    let silent: Vec<UnixStream> = (0..SILENT)
        .map(|_| UnixStream::connect(&d.socket).unwrap())
        .collect();
    d.wait_for(Duration::from_secs(10), "every silent one accepted", || {
        closed(&d, "evicted") == (SILENT - held) as f64
    });
    assert_eq!(
        sample(&d.metrics(), "gpumon_ingest_connections"),
        Some(held as f64)
    );

    let (mut s, welcome, took) = trainer(&d);
    println!("trainer welcomed {took:?} after connecting, with {SILENT} silent connections made");
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    // Locked out, the trainer would wait for a silent connection's 10 s hello deadline: a
    // quarter of it is a deadline a loaded machine keeps, not a benchmark.
    assert!(took < Duration::from_millis(2500), "{took:?}");
    s.write_all(sample_line(1).as_bytes()).unwrap();

    // The evicted ones were told why and closed; the newest silent ones are still held.
    let first = last_words(&silent[0]);
    assert_eq!(first["code"], "no_hello", "{first}");
    let msg = first["message"].as_str().unwrap();
    assert!(msg.contains(key), "{msg}");
    let m = d.metrics();
    assert_eq!(
        sample(&m, "gpumon_ingest_closed_total{reason=\"evicted\"}"),
        Some((SILENT - held + 1) as f64),
        "the trainer's connection took one more"
    );
    for reason in ["hello_timeout", "idle_timeout", "per_uid_limit"] {
        let series = format!("gpumon_ingest_closed_total{{reason=\"{reason}\"}}");
        assert_eq!(sample(&m, &series), Some(0.0), "{reason}");
    }
    assert_eq!(sample(&m, "gpumon_ingest_connections"), Some(held as f64));
    d.wait_for(Duration::from_secs(5), "the trainer's sample", || {
        sample(&d.metrics(), "gpumon_ingest_lines_total") == Some(2.0)
    });
    let newest = &silent[SILENT - 1];
    newest.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        (&*newest).read(&mut buf).map_err(|e| e.kind()).unwrap_err(),
        ErrorKind::WouldBlock,
        "still open, nothing said"
    );
}

#[test]
fn connections_without_hello_are_closed_at_the_deadline_and_counted() {
    let d = Daemon::start(DaemonOpts {
        config: "[ingest]\nhello_timeout_seconds = 1\n".into(),
        ..DaemonOpts::default()
    });
    let (mut real, _, _) = trainer(&d);
    let silent: Vec<UnixStream> = (0..50)
        .map(|_| UnixStream::connect(&d.socket).unwrap())
        .collect();
    // Lines without a hello do not keep a connection: the deadline is from connecting.
    let mut chatty = UnixStream::connect(&d.socket).unwrap();
    let t = Instant::now();
    chatty.write_all(sample_line(1).as_bytes()).unwrap();
    let said = said_until_closed(&chatty);
    let took = t.elapsed();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(said.iter().all(|e| e["code"] == "no_hello"), "{said:?}");
    let msg = said[1]["message"].as_str().unwrap();
    assert!(
        msg.contains("no hello within 1 s of connecting (ingest.hello_timeout_seconds)"),
        "{msg}"
    );
    assert!(
        took < Duration::from_secs(3),
        "closed {took:?} after connecting"
    );
    for s in &silent {
        assert_eq!(last_words(s)["code"], "no_hello");
    }
    d.wait_for(Duration::from_secs(5), "51 counted", || {
        closed(&d, "hello_timeout") == 51.0
    });
    // The trainer that said hello at once is past the deadline and still served.
    real.write_all(sample_line(1).as_bytes()).unwrap();
    d.wait_for(Duration::from_secs(5), "its sample", || {
        let m = d.metrics();
        sample(&m, "gpumon_ingest_lines_total") == Some(2.0)
            && sample(&m, "gpumon_ingest_connections") == Some(1.0)
    });
    assert_eq!(closed(&d, "evicted"), 0.0);
}

#[test]
fn an_idle_session_is_closed_without_a_crash() {
    let d = Daemon::start(DaemonOpts {
        config: "[ingest]\nidle_timeout_seconds = 1\n".into(),
        ..DaemonOpts::default()
    });
    let (mut idle, _, _) = trainer(&d);
    idle.write_all(sample_line(1).as_bytes()).unwrap();
    let (mut busy, _, _) = trainer(&d);
    // One sample every 300 ms for 2.4 s: never 1 s without a line, so never closed.
    for step in 1..=8 {
        busy.write_all(sample_line(step).as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut rest = Vec::new();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    idle.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "closed without a reply: {rest:?}");
    d.wait_for(Duration::from_secs(5), "counted", || {
        closed(&d, "idle_timeout") == 1.0
    });
    let snap = d.snapshot();
    let sessions = snap["sessions"].as_array().unwrap();
    let ended: Vec<_> = sessions.iter().filter(|s| !s["ended"].is_null()).collect();
    assert_eq!(ended.len(), 1, "{sessions:?}");
    assert_eq!(ended[0]["ended"][1], "clean", "{}", ended[0]);
    let events = ended[0]["events"].as_array().unwrap();
    let why = events.iter().find(|e| e["kind"] == "idle_timeout");
    let why = why.unwrap_or_else(|| panic!("{events:?}"));
    assert!(
        why["detail"]
            .as_str()
            .unwrap()
            .contains("ingest.idle_timeout_seconds"),
        "{why}"
    );
    let crashes = snap["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "crash")
        .count();
    assert_eq!(crashes, 0, "an idle close is not a trainer death");
    assert_eq!(sample(&d.metrics(), "gpumon_ingest_connections"), Some(1.0));
}

#[test]
fn a_user_whose_connections_all_said_hello_is_refused_past_its_cap() {
    let d = Daemon::start(DaemonOpts {
        config: "[ingest]\nmax_connections_per_uid = 2\n".into(),
        ..DaemonOpts::default()
    });
    let (_a, _, _) = trainer(&d);
    let (mut b, _, _) = trainer(&d);
    let third = UnixStream::connect(&d.socket).unwrap();
    let refused = last_words(&third);
    assert_eq!(refused["code"], "too_many_connections", "{refused}");
    let msg = refused["message"].as_str().unwrap();
    assert!(
        msg.contains("holds 2 connections") && msg.contains("ingest.max_connections_per_uid"),
        "{msg}"
    );
    assert_eq!(closed(&d, "per_uid_limit"), 1.0);
    // A slot given back is usable again.
    b.write_all(b"{\"type\":\"bye\"}\n").unwrap();
    drop(b);
    d.wait_for(Duration::from_secs(5), "one connection left", || {
        sample(&d.metrics(), "gpumon_ingest_connections") == Some(1.0)
    });
    let (_c, welcome, _) = trainer(&d);
    assert_eq!(welcome["type"], "welcome", "{welcome}");
}
