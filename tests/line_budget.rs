//! Connections that each hold an unfinished long line cannot make the daemon buffer more than
//! `ingest.max_line_buffer_bytes` between them: a trainer's own long line still gets through
//! (the stalest holders are closed, `line_stalled`, to make room), and the bytes come back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;

const BUDGET: usize = 128 * 1024;

fn hello(s: &UnixStream, rank: usize) {
    let mut w = s;
    w.write_all(
        format!("{{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"lines\",\"rank\":{rank}}}\n")
            .as_bytes(),
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.contains("\"welcome\""), "{line}");
}

/// A sample line of about `len` bytes: a long `note`-free stats map.
fn long_sample(step: u64, len: usize) -> String {
    let mut stats = String::from("\"allocated_bytes.all.current\":1000");
    let mut k = 0;
    while stats.len() + 80 < len {
        stats.push_str(&format!(",\"x_pad_{k:06}.all.current\":{k}"));
        k += 1;
    }
    format!(
        "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{{stats}}}}}\n",
        1_763_700_000 + step
    )
}

#[test]
fn unfinished_long_lines_stay_within_the_budget_and_a_trainer_s_long_line_gets_through() {
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&scenario("two_gpus")),
        config: format!("[ingest]\nmax_line_buffer_bytes = {BUDGET}\n"),
        ..DaemonOpts::default()
    });
    // 24 clients each send 60 KB of a line and stop: together over ten times the budget.
    let holders: Vec<UnixStream> = (0..24)
        .map(|i| {
            let s = UnixStream::connect(&d.socket).unwrap();
            hello(&s, i + 1);
            let part = long_sample(1, 60_000);
            let mut w = &s;
            w.write_all(&part.as_bytes()[..part.len() - 100]).unwrap();
            s
        })
        .collect();
    let used = || sample(&d.metrics(), "gpumon_ingest_line_buffer_bytes").unwrap();
    d.wait_for(Duration::from_secs(5), "the budget in use", || used() > 0.0);
    let mut most = 0.0f64;
    for _ in 0..10 {
        most = most.max(used());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        most <= BUDGET as f64,
        "{most} bytes buffered, budget {BUDGET}"
    );

    // A trainer's own 50 KB line, written whole, is taken: a stale holder gives way. The
    // holders are made stale first (STALE, 1 s, without finishing their lines), so what is
    // tested is that they give way, not who of them and the trainer waited longest.
    std::thread::sleep(Duration::from_millis(1300));
    let t = UnixStream::connect(&d.socket).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    hello(&t, 100);
    let started = Instant::now();
    let mut w = &t;
    w.write_all(long_sample(1, 50_000).as_bytes()).unwrap();
    // A bad line after it: its error reply comes once the long line was handled.
    w.write_all(b"{oops\n").unwrap();
    let mut reply = String::new();
    BufReader::new(&t).read_line(&mut reply).unwrap();
    assert!(reply.contains("bad_json"), "{reply}");
    let took = started.elapsed();
    // Gets through rather than waiting for the holders to go on their own (they never do):
    // seconds alone, more on a machine busy with the rest of the suite.
    assert!(
        took < Duration::from_secs(20),
        "the trainer's line took {took:?}"
    );
    // The counters are encoded with each collection, so they may trail the reply by a poll.
    d.wait_for(Duration::from_secs(5), "the lines counted", || {
        let m = d.metrics();
        sample(&m, "gpumon_ingest_rejected_total{code=\"bad_json\"}").unwrap() >= 1.0
            && sample(&m, "gpumon_ingest_lines_total").unwrap() >= 26.0
    });
    let m = d.metrics();
    let stalled = sample(&m, "gpumon_ingest_closed_total{reason=\"line_stalled\"}").unwrap();
    assert!(stalled >= 1.0, "no holder was closed");

    // A closed holder was told why, and its session ended without a crash finding.
    let mut told = 0;
    for s in &holders {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = String::new();
        let _ = (&*s).read_to_string(&mut buf);
        if buf.contains("line_too_long") && buf.contains("max_line_buffer_bytes") {
            told += 1;
        }
    }
    assert!(told >= 1, "no holder got the reason");
    let crashes = d.snapshot()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "crash")
        .count();
    assert_eq!(crashes, 0);

    // Once every connection goes, every byte granted comes back. (The trainer's connection
    // may keep its grant while idle after its burst: it is given back when another needs it,
    // or when the connection goes.)
    drop(t);
    drop(holders);
    d.wait_for(Duration::from_secs(5), "the budget given back", || {
        used() == 0.0
    });
}
