//! Fair ingest slots on the real daemon over its real socket, with connections from several
//! uids: users holding every slot with quiet sessions do not keep another user's trainer out,
//! concurrent hellos never open more sessions than `max_connections`, and a trainer asked to
//! leave reconnects and loses nothing.
//!
//! Other uids without other processes: SO_PEERCRED records the connecting thread's effective
//! uid, and credentials are per thread under the raw syscalls, so a thread that switches its
//! euid (keeping fsuid 0, to reach the root-only socket directory) connects as that user.
//! Needs root; elsewhere each test says so and passes without running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

fn hello(job: &str) -> String {
    format!("{{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"{job}\",\"rank\":0}}\n")
}

const SAMPLE: &str = "{\"type\":\"sample\",\"ts\":1763700001,\"step\":1,\"stats\":{\"allocated_bytes.all.current\":1000}}\n";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: connecting as other uids needs root");
    }
    root
}

/// Runs `f` on a thread whose effective uid is `uid` (its fsuid stays 0, so paths resolve as
/// root's): what it connects is credited to `uid`.
fn as_uid<T: Send + 'static>(uid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let keep = libc::uid_t::MAX; // -1: leave that id as it is
                                     // SAFETY: raw syscalls change only this thread's credentials (libc's wrappers would
                                     // change every thread's); real and saved uid stay 0, so both can be undone.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresuid, keep, uid, keep), 0);
            libc::syscall(libc::SYS_setfsuid, 0);
        }
        let r = f();
        // SAFETY: as above.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresuid, keep, 0, keep), 0);
        }
        r
    })
    .join()
    .unwrap()
}

/// Connects as the thread's user, says hello and reads the reply.
fn greet(socket: &Path, job: &str) -> (UnixStream, serde_json::Value) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(hello(job).as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    let reply = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (s, reply)
}

/// Reads what is there on `s` into `said`; true once the daemon has closed it.
fn drain(s: &UnixStream, said: &mut Vec<u8>) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => said.extend_from_slice(&buf[..n]),
            Err(_) => return false,
        }
    }
}

fn live_sessions(d: &Daemon) -> usize {
    let snap = d.snapshot();
    let all = snap["sessions"].as_array().unwrap();
    all.iter().filter(|s| s["ended"].is_null()).count()
}

fn metric(d: &Daemon, series: &str) -> f64 {
    sample(&d.metrics(), series).unwrap_or_else(|| panic!("{series} missing"))
}

#[test]
fn four_users_holding_every_slot_with_quiet_sessions_do_not_keep_a_fifth_or_root_out() {
    if !is_root() {
        return;
    }
    const CAP: usize = 64;
    let d = Daemon::start(DaemonOpts {
        config: format!("[ingest]\nmax_connections = {CAP}\nreserved_connections = 4\n"),
        ..DaemonOpts::default()
    });
    // Uids 20001-20004 take 16 slots each and go quiet, but for one session that samples.
    let mut held: Vec<(u32, UnixStream)> = Vec::new();
    for uid in 20001..=20004u32 {
        let socket = d.socket.clone();
        let conns = as_uid(uid, move || {
            (0..CAP / 4)
                .map(|i| {
                    let (s, w) = greet(&socket, &format!("quiet-{uid}-{i}"));
                    assert_eq!(w["type"], "welcome", "{w}");
                    s
                })
                .collect::<Vec<_>>()
        });
        held.extend(conns.into_iter().map(|s| (uid, s)));
    }
    held[0].1.write_all(SAMPLE.as_bytes()).unwrap();
    d.wait_for(Duration::from_secs(5), "every slot a session", || {
        live_sessions(&d) == CAP && metric(&d, "gpumon_ingest_lines_total") == (CAP + 1) as f64
    });

    // A fifth user's trainer: 64 / 5 users = a share of 12; all four hold 16, so the lowest
    // uid gives way, with its quietest session (not the one that sampled).
    let socket = d.socket.clone();
    let t = Instant::now();
    let (mut fifth, w) = as_uid(20005, move || greet(&socket, "fifth"));
    println!(
        "fifth user's trainer welcomed {:?} after connecting",
        t.elapsed()
    );
    assert_eq!(w["type"], "welcome", "{w}");
    fifth.write_all(SAMPLE.as_bytes()).unwrap();
    let mut said = vec![Vec::new(); held.len()];
    let gone = evicted(&held, &mut said, 1);
    assert_eq!(gone[0].0, 20001);
    assert_ne!(gone[0].1, 0, "the session that sampled stays");
    let msg = gone[0].2["message"].as_str().unwrap().to_string();
    for part in [
        "uid 20001 held 16 of the 64 slots (ingest.max_connections)",
        "fair share of 12 (64 / 5 users holding slots)",
        "no line since its hello",
        "ack",
    ] {
        assert!(msg.contains(part), "{part:?} in {msg}");
    }

    // Root is not special either way: six users, a share of 10; 20002 holds the most.
    let (_root, w) = greet(&d.socket, "root");
    assert_eq!(w["type"], "welcome", "{w}");
    let gone = evicted(&held, &mut said, 2);
    assert_eq!(gone[1].0, 20002, "{gone:?}");

    d.wait_for(Duration::from_secs(5), "the evicted sessions ended", || {
        live_sessions(&d) == CAP
    });
    assert_eq!(
        metric(&d, "gpumon_ingest_rejected_total{code=\"evicted\"}"),
        2.0
    );
    assert_eq!(metric(&d, "gpumon_ingest_connections"), CAP as f64);
    // Ended cleanly: the trainer may be alive and reconnect; no crash finding.
    let snap = d.snapshot();
    let ended: Vec<_> = snap["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["ended"].is_null())
        .collect();
    assert_eq!(ended.len(), 2);
    assert!(ended.iter().all(|s| s["ended"][1] == "clean"), "{ended:?}");
    let crashes = snap["findings"].as_array().unwrap();
    assert!(crashes.iter().all(|f| f["kind"] != "crash"), "{crashes:?}");
}

/// Waits until `n` of `held` were closed; (uid, index, last line) of each, in index order.
/// `said` keeps what each sent across calls.
fn evicted(
    held: &[(u32, UnixStream)],
    said: &mut [Vec<u8>],
    n: usize,
) -> Vec<(u32, usize, serde_json::Value)> {
    let start = Instant::now();
    loop {
        let mut gone = Vec::new();
        for (i, (uid, s)) in held.iter().enumerate() {
            if drain(s, &mut said[i]) {
                let text = String::from_utf8_lossy(&said[i]).to_string();
                let last = text.lines().last().unwrap_or_default();
                let last: serde_json::Value = serde_json::from_str(last).unwrap_or_default();
                assert_eq!(
                    last["code"], "evicted",
                    "connection {i} of uid {uid}: {text:?}"
                );
                gone.push((*uid, i, last));
            }
        }
        if gone.len() >= n {
            assert_eq!(gone.len(), n, "{gone:?}");
            return gone;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{gone:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn five_users_saying_hello_at_once_never_open_more_sessions_than_the_cap() {
    if !is_root() {
        return;
    }
    const CAP: usize = 256;
    const EACH: usize = 80;
    let d = Daemon::start(DaemonOpts {
        config: format!("[ingest]\nmax_connections = {CAP}\nreserved_connections = 8\n"),
        ..DaemonOpts::default()
    });
    let d = Arc::new(d);
    // Watches the sessions the API shows while the hellos race.
    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (d, done, most) = (d.clone(), done.clone(), most.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                most.fetch_max(live_sessions(&d), Ordering::SeqCst);
            }
        })
    };
    let users: Vec<_> = (20001..=20005u32)
        .map(|uid| {
            let socket = d.socket.clone();
            std::thread::spawn(move || {
                as_uid(uid, move || {
                    let conns: Vec<UnixStream> = (0..EACH)
                        .filter_map(|_| {
                            let mut s = UnixStream::connect(&socket).ok()?;
                            let _ = s.write_all(hello("race").as_bytes());
                            Some(s)
                        })
                        .collect();
                    conns
                })
            })
        })
        .collect();
    let conns: Vec<UnixStream> = users.into_iter().flat_map(|u| u.join().unwrap()).collect();
    // Every connection hears back (welcome, or the line it was closed with).
    let mut welcomed = 0;
    for s in &conns {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut line = String::new();
        let _ = BufReader::new(s).read_line(&mut line);
        welcomed += usize::from(line.contains("\"welcome\""));
    }
    std::thread::sleep(Duration::from_millis(300));
    done.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    let most = most.load(Ordering::SeqCst);
    let live = live_sessions(&d);
    println!(
        "{} hellos from 5 users at once: {welcomed} welcomed, at most {most} sessions open, {live} at the end (cap {CAP})",
        conns.len()
    );
    assert!(most <= CAP, "{most} sessions open against a cap of {CAP}");
    assert!((CAP - 8..=CAP).contains(&live), "{live}");
    assert!(metric(&d, "gpumon_ingest_connections") <= CAP as f64);
}

#[test]
fn a_trainer_asked_to_leave_reconnects_and_loses_nothing() {
    if !is_root() {
        return;
    }
    let record = tempfile::tempdir().unwrap();
    let d = Daemon::start(DaemonOpts {
        // No reserve: both trainers may connect before either says hello.
        config: "[ingest]\nmax_connections = 2\nreserved_connections = 0\n".into(),
        args: vec!["--record-dir".into(), record.path().display().to_string()],
        ..DaemonOpts::default()
    });
    // Two real reference clients (capability ack) as root, 20 steps a second, hold both slots.
    let work = tempfile::tempdir().unwrap();
    let (stop, out) = (work.path().join("stop"), work.path().join("out.json"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/lossless/load.py");
    let mut load = Command::new("python3")
        .arg(&script)
        .arg(&d.socket)
        .args(["2", "20"])
        .arg(&stop)
        .arg(&out)
        .stdout(Stdio::null())
        .spawn()
        .expect("python3");
    d.wait_for(Duration::from_secs(10), "both trainers sampling", || {
        live_sessions(&d) == 2 && metric(&d, "gpumon_ingest_lines_total") > 20.0
    });
    // Another user: a share of 1 each, root holds 2, so root's quietest trainer gives way.
    let socket = d.socket.clone();
    let (mut other, w) = as_uid(20001, move || greet(&socket, "other"));
    assert_eq!(w["type"], "welcome", "{w}");
    d.wait_for(Duration::from_secs(5), "one evicted", || {
        metric(&d, "gpumon_ingest_rejected_total{code=\"evicted\"}") == 1.0
    });
    // It cannot come back while the other user holds its share; it buffers meanwhile.
    std::thread::sleep(Duration::from_secs(1));
    other.write_all(b"{\"type\":\"bye\"}\n").unwrap();
    drop(other);
    d.wait_for(Duration::from_secs(10), "the trainer back", || {
        live_sessions(&d) == 2
    });
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&stop, b"").unwrap();
    let start = Instant::now();
    while load.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "load.py did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let clients = report.as_array().unwrap();
    let reconnected = clients.iter().filter(|c| c["connects"].as_u64() >= Some(2));
    assert_eq!(reconnected.count(), 1, "{report}");
    for c in clients {
        for key in ["dropped", "unconfirmed", "rate_skipped"] {
            assert_eq!(c[key], 0, "{key}: {c}");
        }
    }
    // Every step of both trainers reached the daemon: the sessions' samples, per rank.
    let steps = clients[0]["steps"].as_u64().unwrap();
    let snap = d.snapshot();
    let mut per_rank = [0u64; 2];
    for s in snap["sessions"].as_array().unwrap() {
        if s["job"] == "lossless" {
            per_rank[s["rank"].as_u64().unwrap() as usize] += s["samples"].as_u64().unwrap();
        }
    }
    println!("steps {steps}, samples per rank {per_rank:?}: {report}");
    assert!(
        per_rank.iter().all(|n| *n >= steps),
        "{per_rank:?} of {steps}"
    );
}
