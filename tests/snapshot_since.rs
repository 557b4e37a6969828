//! `/api/v1/snapshot?since=CURSOR` against the real daemon: after a cursor, only the history
//! that came after it; a cursor from another daemon gets a whole answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// A trainer that said hello; its session id.
fn trainer(d: &Daemon) -> (UnixStream, String) {
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    (&s).write_all(b"{\"type\":\"hello\",\"v\":1,\"job\":\"since\",\"rank\":0}\n")
        .unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let welcome: Value = serde_json::from_str(&line).unwrap();
    (s, welcome["session"].as_str().unwrap().to_string())
}

/// Pushes steps `from..to` and waits until the daemon has them.
fn push(d: &Daemon, w: &mut UnixStream, id: &str, from: u64, to: u64) {
    for step in from..to {
        let line = format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{}}}}}\n",
            1_763_700_000 + step,
            (step + 1) << 20
        );
        w.write_all(line.as_bytes()).unwrap();
    }
    d.wait_for(Duration::from_secs(5), "the samples", || {
        let (code, body) = d.get(&format!("/api/v1/sessions/{id}"));
        code == 200 && serde_json::from_str::<Value>(&body).unwrap()["samples"] == to
    });
}

fn snapshot(d: &Daemon, query: &str) -> Value {
    let (code, body) = d.get(&format!("/api/v1/snapshot?history=300{query}"));
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn steps(snap: &Value) -> Vec<u64> {
    snap["sessions"][0]["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["value"]["step"].as_u64().unwrap())
        .collect()
}

fn newest_gpu_point(snap: &Value) -> f64 {
    snap["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["history"].as_array().unwrap())
        .map(|p| p["ts"].as_f64().unwrap())
        .fold(f64::MIN, f64::max)
}

#[test]
fn after_a_cursor_the_snapshot_sends_only_the_points_that_came_after_it() {
    let d = Daemon::with_scenario("two_gpus");
    let (mut w, id) = trainer(&d);
    push(&d, &mut w, &id, 0, 5);

    let first = snapshot(&d, "&since=");
    assert_eq!(first["delta"], false);
    assert_eq!(steps(&first), vec![0, 1, 2, 3, 4]);
    let cursor = first["cursor"].as_str().unwrap();
    assert!(
        cursor
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
        "{cursor}"
    );
    let seen = newest_gpu_point(&first);

    push(&d, &mut w, &id, 5, 8);
    // Polls every 100 ms: a few new GPU points too.
    std::thread::sleep(Duration::from_millis(300));
    let next = snapshot(&d, &format!("&since={cursor}"));
    assert_eq!(next["delta"], true);
    assert_eq!(steps(&next), vec![5, 6, 7]);
    assert_eq!(next["sessions"][0]["samples"], 8);
    let points: Vec<f64> = next["gpus"][0]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["ts"].as_f64().unwrap())
        .collect();
    assert!(!points.is_empty());
    assert!(points.iter().all(|&t| t > seen), "{points:?} after {seen}");
    // The GPUs whole; their processes, unchanged, left out.
    assert_eq!(next["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(next["processes_kept"], serde_json::json!([0, 1]));
    assert_eq!(next["processes"], serde_json::json!([]));
    assert_eq!(first["processes"].as_array().unwrap().len(), 4);
    assert!(first.get("processes_kept").is_none());

    // Without `since`, the answer is as it always was.
    let plain = snapshot(&d, "");
    for field in ["cursor", "delta", "processes_kept"] {
        assert!(plain.get(field).is_none(), "{field}");
    }
    assert_eq!(plain["processes"], first["processes"]);
    assert_eq!(steps(&plain), (0..8).collect::<Vec<_>>());
    drop(w);

    // A restarted daemon does not honour the cursor: the whole answer, and a cursor of its own.
    let other = Daemon::with_scenario("two_gpus");
    let (mut w, id) = trainer(&other);
    push(&other, &mut w, &id, 0, 3);
    let restarted = snapshot(&other, &format!("&since={cursor}"));
    assert_eq!(restarted["delta"], false);
    assert_eq!(steps(&restarted), vec![0, 1, 2]);
    assert_ne!(restarted["cursor"], first["cursor"]);
}

#[test]
fn a_damaged_cursor_is_not_an_error_but_a_whole_answer() {
    let d = Daemon::with_scenario("two_gpus");
    let (mut w, id) = trainer(&d);
    push(&d, &mut w, &id, 0, 2);
    for bad in ["x", "....", "%E2%80%AE", &"9".repeat(2000)] {
        let snap = snapshot(&d, &format!("&since={bad}"));
        assert_eq!(snap["delta"], false, "{bad}");
        assert_eq!(steps(&snap), vec![0, 1], "{bad}");
    }
}
