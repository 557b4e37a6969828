//! A node that speaks in hostile strings (tests/common/hostile.rs): a real daemon's snapshot
//! made of them, served as a daemon (or a squatter on its port) would, and the checks on what
//! reaches a terminal.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::common::Daemon;
use super::hostile::{first_escape, HOSTILE};
use gpumon::util::printable::{escaped, printable};

/// The characters of `out` a terminal obeys or draws as nothing (newlines between lines
/// aside): every control character, and every character of the hostile strings that is not
/// ASCII. Judged without the rule under test, so that it fails where the rule misses one.
pub fn raw(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .chars()
        .filter(|c| {
            *c != '\n'
                && (c.is_control()
                    || !c.is_ascii() && HOSTILE.iter().any(|s| s.contains(*c))
                    || escaped(*c))
        })
        .map(|c| format!("U+{:04X}", c as u32))
        .collect()
}

/// Each hostile string that `text` does not show escaped (to its first escape at least).
pub fn missing(text: &str) -> Vec<&'static str> {
    HOSTILE
        .iter()
        .copied()
        .filter(|s| !text.contains(first_escape(&printable(s))))
        .collect()
}

/// Serves `body` as the snapshot to every request, as a daemon (or a squatter on its port)
/// would.
pub fn serve(body: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr.to_string()
}

/// A real daemon's snapshot with a trainer session per hostile string, named as its job, and
/// one process per hostile string, named, owned and contained by it.
pub fn hostile_snapshot() -> serde_json::Value {
    let d = Daemon::with_scenario("two_gpus");
    let _sessions = open_sessions(&d.socket);
    d.wait_for(Duration::from_secs(20), "a session per string", || {
        d.snapshot()["sessions"]
            .as_array()
            .is_some_and(|s| s.len() == HOSTILE.len())
    });
    let mut snap = d.snapshot();
    let one = snap["processes"][0].clone();
    let procs: Vec<serde_json::Value> = HOSTILE
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut p = one.clone();
            p["pid"] = (40_000 + i).into();
            p["name"] = (*s).into();
            p["user"] = (*s).into();
            p["container"] = (*s).into();
            p
        })
        .collect();
    snap["processes"] = procs.into();
    snap
}

/// Opens a trainer session per hostile string, named as its job; the sessions stay open until
/// the returned streams are dropped.
pub fn open_sessions(socket: &std::path::Path) -> Vec<UnixStream> {
    HOSTILE
        .iter()
        .map(|s| {
            let start = Instant::now();
            let mut w = loop {
                match UnixStream::connect(socket) {
                    Ok(w) => break w,
                    Err(e) if start.elapsed() > Duration::from_secs(30) => {
                        panic!("no ingest socket at {}: {e}", socket.display())
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let hello = serde_json::json!({"type": "hello", "v": 1, "pid": 7, "job": s,
                "rank": 0, "client": "test/1"});
            writeln!(w, "{hello}").unwrap();
            let mut welcome = String::new();
            BufReader::new(w.try_clone().unwrap())
                .read_line(&mut welcome)
                .unwrap();
            assert!(welcome.contains("welcome"), "{welcome}");
            w
        })
        .collect()
}
