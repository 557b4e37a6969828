//! The daemon reads a connection in batches (one store lock per read, not per line). Over the
//! real socket: a burst that mixes good and bad lines, written at once so it arrives as few
//! reads, still gets one reply per bad line with its own line number, every line counted, and
//! every sample stored; and /api/v1/sessions/{id} serves the snapshot's view of one session.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

fn sample_line(t0: u64, step: u64) -> String {
    format!(
        "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{},\"reserved_bytes.all.current\":4096}}}}\n",
        t0 + step,
        step * 8
    )
}

#[test]
fn a_burst_of_mixed_lines_gets_per_line_replies_and_counts() {
    let d = Daemon::with_scenario("two_gpus");
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    // Ten minutes ago: the daemon takes samples over an hour old (or ahead) at their arrival.
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 600;
    let mut burst = String::new();
    burst.push_str(&sample_line(t0, 0)); // line 1: no_hello
    burst.push_str("{\"type\":\"hello\",\"v\":1,\"job\":\"burst\"}\n");
    // Bad lines every 50 samples, each at a known line number.
    let mut bad = Vec::new();
    for step in 1..=500u64 {
        burst.push_str(&sample_line(t0, step));
        if step % 50 == 0 {
            burst.push_str("{\"type\":\"sample\",\"ts\":\"soon\"}\n");
            bad.push(burst.lines().count());
        }
    }
    (&s).write_all(burst.as_bytes()).unwrap();

    let mut reply = || {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    let first = reply();
    assert_eq!(
        (first["code"].as_str(), first["line"].as_u64()),
        (Some("no_hello"), Some(1))
    );
    let welcome = reply();
    assert_eq!(welcome["type"], "welcome");
    for line in &bad {
        let e = reply();
        assert_eq!(e["code"], "bad_field", "{e}");
        assert_eq!(e["line"].as_u64(), Some(*line as u64), "{e}");
    }

    let session = welcome["session"].as_str().unwrap().to_string();
    let path = format!("/api/v1/sessions/{session}");
    d.wait_for(Duration::from_secs(5), "all 500 samples", || {
        let (_, body) = d.get(&path);
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["samples"] == 500
    });
    let m = d.metrics();
    assert_eq!(sample(&m, "gpumon_ingest_lines_total"), Some(501.0));
    assert_eq!(
        sample(&m, "gpumon_ingest_rejected_total{code=\"bad_field\"}"),
        Some(10.0)
    );
    assert_eq!(
        sample(&m, "gpumon_ingest_rejected_total{code=\"no_hello\"}"),
        Some(1.0)
    );

    // The per-session view is the snapshot's entry, field for field, when both come from the
    // same published view: a poll between the two requests moves time-derived fields (the
    // ledger's age), so a pair that straddles one is taken again.
    let mut pairs = Vec::new();
    let one = loop {
        let (code, body) = d.get(&path);
        assert_eq!(code, 200);
        let one: serde_json::Value = serde_json::from_str(&body).unwrap();
        let snap = d.snapshot();
        let listed = snap["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["session"] == session.as_str())
            .unwrap()
            .clone();
        if one == listed {
            break one;
        }
        pairs.push((one, listed));
        assert!(pairs.len() < 10, "never the same in 10 tries: {pairs:?}");
    };
    assert_eq!(one["step"], 500);
    let series = one["series"].as_array().unwrap();
    assert_eq!(series.len(), 300, "the snapshot's window of session points");
    assert_eq!(series[299]["value"]["step"], 500);
    assert_eq!(series[299]["value"]["allocated"], 4000);
    assert_eq!(
        series[299]["ts"],
        (t0 + 500) as f64,
        "kept at their own times"
    );
    assert_eq!(
        sample(&d.metrics(), "gpumon_ingest_timestamps_clamped_total"),
        Some(0.0)
    );

    let (code, body) = d.get("/api/v1/sessions/s-999");
    assert_eq!(code, 404);
    assert!(body.contains("s-999"), "{body}");
}
