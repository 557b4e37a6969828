//! Trainers pushing over the real Unix socket into the real daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";

fn connect(d: &Daemon) -> (UnixStream, BufReader<UnixStream>) {
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn reply(r: &mut BufReader<UnixStream>) -> serde_json::Value {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

fn hello(job: &str) -> String {
    format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"{job}\",\"rank\":3,\"gpu_uuid\":\"{GPU0}\",\"client\":\"test/1\",\"torch\":\"2.5.1\"}}\n"
    )
}

fn sample_line(step: u64, allocated: u64, retries: u64) -> String {
    format!(
        "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{allocated},\"allocated_bytes.all.peak\":{},\"reserved_bytes.all.current\":{},\"num_alloc_retries\":{retries}}}}}\n",
        1_763_700_000 + step,
        allocated * 2,
        allocated * 4
    )
}

#[test]
fn a_trainer_session_shows_up_in_metrics_and_the_api() {
    let d = Daemon::with_scenario("two_gpus");
    let (mut w, mut r) = connect(&d);
    w.write_all(hello("llama-ft").as_bytes()).unwrap();
    let welcome = reply(&mut r);
    assert_eq!(welcome["type"], "welcome");
    assert_eq!(welcome["v"], 1);
    let session = welcome["session"].as_str().unwrap().to_string();
    for step in 1..=5 {
        w.write_all(sample_line(step, 1000 * step, 2).as_bytes())
            .unwrap();
    }
    // A reset of the retry counter (trainer called reset_peak_memory_stats) is not a decrease.
    w.write_all(sample_line(6, 6000, 1).as_bytes()).unwrap();
    let me = std::process::id();
    let labels =
        format!("{{gpu=\"0\",uuid=\"{GPU0}\",pid=\"{me}\",job_name=\"llama-ft\",rank=\"3\"}}");
    d.wait_for(Duration::from_secs(5), "step 6 in /metrics", || {
        sample_of(&d.metrics(), "gpumon_trainer_step", &labels) == Some(6.0)
    });
    let m = d.metrics();
    assert_eq!(
        sample_of(&m, "gpumon_trainer_allocated_bytes", &labels),
        Some(6000.0)
    );
    assert_eq!(
        sample_of(&m, "gpumon_trainer_reserved_bytes", &labels),
        Some(24000.0)
    );
    assert_eq!(
        sample_of(&m, "gpumon_trainer_alloc_retries_total", &labels),
        Some(3.0)
    );
    assert_eq!(
        sample_of(&m, "gpumon_fragmentation_ratio", &labels),
        Some(0.75)
    );
    assert!(m.contains(&format!("session=\"{session}\"")));
    assert_eq!(sample(&m, "gpumon_ingest_connections"), Some(1.0));
    assert_eq!(sample(&m, "gpumon_ingest_lines_total"), Some(7.0));
    promtool_check(&m);

    let snap = d.snapshot();
    let s = &snap["sessions"][0];
    assert_eq!(
        s["pid"].as_u64(),
        Some(me as u64),
        "host pid from SO_PEERCRED"
    );
    assert_eq!(
        s["ns_pid"], 7,
        "the pid the trainer claimed is kept for display"
    );
    assert_eq!(s["gpu"], 0);
    assert_eq!(s["samples"], 6);
    assert_eq!(s["series"].as_array().unwrap().len(), 6);
    // The ingest counters of /metrics, in the API for the TUI header.
    assert_eq!(snap["ingest"]["connections"], 1);
    assert_eq!(snap["ingest"]["lines"], 7);
    assert_eq!(snap["ingest"]["rejected"], 0);

    w.write_all(b"{\"type\":\"bye\",\"ts\":1763700100}\n")
        .unwrap();
    d.wait_for(Duration::from_secs(5), "session gone from /metrics", || {
        !d.metrics().contains("gpumon_trainer_step{")
    });
    assert_eq!(d.snapshot()["sessions"][0]["ended"][1], "clean");
}

fn sample_of(m: &str, name: &str, labels: &str) -> Option<f64> {
    sample(m, &format!("{name}{labels}"))
}

#[test]
fn bad_lines_get_their_error_and_the_connection_survives() {
    let d = Daemon::with_scenario("two_gpus");
    // A well-behaved trainer on its own connection while another sends every kind of bad line.
    let (mut by, mut by_r) = connect(&d);
    by.write_all(hello("bystander").as_bytes()).unwrap();
    assert_eq!(reply(&mut by_r)["type"], "welcome");

    let (mut w, mut r) = connect(&d);
    let cases: [(&[u8], &str); 14] = [
        (b"{\"type\":\"sample\",\"ts\":1763700000}\n", "no_hello"),
        (b"{oops\n", "bad_json"),
        (b"{\"type\":\"hello\",\"v\":9}\n", "unsupported_version"),
        (b"\xff\xfe\n", "bad_json"),
        (b"{\"type\":\"dance\"}\n", "unknown_type"),
        (b"{\"type\":\"sample\",\"ts\":-1}\n", "bad_field"),
        // NaN is not JSON at all.
        (b"{\"type\":\"sample\",\"ts\":NaN}\n", "bad_json"),
        (b"{\"type\":\"sample\",\"ts\":1e300}\n", "bad_field"),
        (
            b"{\"type\":\"sample\",\"ts\":1763700000,\"device_free\":1e30}\n",
            "bad_field",
        ),
        (
            b"{\"type\":\"sample\",\"ts\":1763700000,\"stats\":{\"num_ooms\":-1}}\n",
            "bad_field",
        ),
        (
            b"{\"type\":\"sample\",\"ts\":1763700000,\"stats\":{\"allocated_bytes.all.current\":1152921504606846976}}\n",
            "bad_field",
        ),
        // Wrong types.
        (b"{\"type\":\"sample\",\"ts\":\"now\"}\n", "bad_field"),
        (b"{\"type\":\"hello\",\"v\":\"1\"}\n", "bad_field"),
        (
            b"{\"type\":\"sample\",\"ts\":1763700000,\"step\":1.5}\n",
            "bad_field",
        ),
    ];
    for (i, (line, code)) in cases.iter().enumerate() {
        w.write_all(line).unwrap();
        let e = reply(&mut r);
        assert_eq!(e["type"], "error");
        assert_eq!(e["code"], *code, "case {i}: {e}");
        assert_eq!(e["line"], i as u64 + 1);
        assert!(!e["message"].as_str().unwrap().is_empty());
    }
    let mut long = vec![b'x'; 70_000];
    long.push(b'\n');
    w.write_all(&long).unwrap();
    assert_eq!(reply(&mut r)["code"], "line_too_long");
    w.write_all(hello("j").as_bytes()).unwrap();
    assert_eq!(reply(&mut r)["type"], "welcome");
    w.write_all(hello("j").as_bytes()).unwrap();
    assert_eq!(reply(&mut r)["code"], "duplicate_hello");
    let m = d.metrics();
    for (code, n) in [
        ("bad_json", 3.0),
        ("no_hello", 1.0),
        ("line_too_long", 1.0),
        ("duplicate_hello", 1.0),
        ("bad_field", 8.0),
        ("unsupported_version", 1.0),
        ("unknown_type", 1.0),
    ] {
        assert_eq!(
            sample(
                &m,
                &format!("gpumon_ingest_rejected_total{{code=\"{code}\"}}")
            ),
            Some(n),
            "{code}"
        );
    }
    // Half a line at EOF, then close without bye: counted, and recorded as a crash.
    w.write_all(b"{\"type\":\"sam").unwrap();
    drop(w);
    drop(r);
    d.wait_for(Duration::from_secs(5), "crash recorded", || {
        session(&d, "j").is_some_and(|s| s["ended"][1] == "crash")
    });
    let m = d.metrics();
    assert_eq!(
        sample(&m, "gpumon_ingest_rejected_total{code=\"bad_json\"}"),
        Some(4.0)
    );
    assert_eq!(sample(&m, "gpumon_ingest_connections"), Some(1.0));
    // The API's ingest health agrees with /metrics.
    let ingest = &d.snapshot()["ingest"];
    assert_eq!(ingest["connections"].as_u64(), Some(1));
    assert!(ingest["rejected"].as_u64().unwrap() >= 9, "{ingest}");

    // The bystander heard nothing but its welcome, and its samples still land.
    by.write_all(sample_line(1, 100, 0).as_bytes()).unwrap();
    d.wait_for(Duration::from_secs(5), "bystander's sample", || {
        session(&d, "bystander").is_some_and(|s| s["samples"] == 1 && s["ended"].is_null())
    });
    assert_silent(&mut by_r);
}

/// The snapshot's session of `job` (the latest one, when several).
fn session(d: &Daemon, job: &str) -> Option<serde_json::Value> {
    let snap = d.snapshot();
    snap["sessions"]
        .as_array()?
        .iter()
        .rev()
        .find(|s| s["job"] == job)
        .cloned()
}

/// Nothing to read on this connection (it got no reply it did not ask for).
fn assert_silent(r: &mut BufReader<UnixStream>) {
    r.get_ref()
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut line = String::new();
    match r.read_line(&mut line) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("expected silence, got {other:?}: {line:?}"),
    }
}

#[test]
fn a_client_over_the_rate_limit_is_throttled_not_closed_and_ends_clean() {
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&scenario("two_gpus")),
        config: "[ingest]\nmax_lines_per_second = 200\n".into(),
        ..DaemonOpts::default()
    });
    let (mut calm, mut calm_r) = connect(&d);
    calm.write_all(hello("calm").as_bytes()).unwrap();
    assert_eq!(reply(&mut calm_r)["type"], "welcome");

    let (mut flood, mut flood_r) = connect(&d);
    flood.write_all(hello("flood").as_bytes()).unwrap();
    let welcome = reply(&mut flood_r);
    assert_eq!(welcome["type"], "welcome");
    assert_eq!(welcome["max_lines_per_second"], 200, "{welcome}");

    // Three times the limit for three seconds, in tenths of a second.
    let started = std::time::Instant::now();
    let mut sent = 0u64;
    for tick in 0..30u64 {
        let lines: String = (0..60).map(|i| sample_line(tick * 60 + i, 1, 0)).collect();
        flood.write_all(lines.as_bytes()).unwrap();
        sent += 60;
        let next = Duration::from_millis(100 * (tick + 1));
        std::thread::sleep(next.saturating_sub(started.elapsed()));
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The bye goes through whatever the bucket holds, and ends the session cleanly.
    flood
        .write_all(b"{\"type\":\"bye\",\"ts\":1763700100}\n")
        .unwrap();
    d.wait_for(Duration::from_secs(5), "flood session ended", || {
        session(&d, "flood").is_some_and(|s| !s["ended"].is_null())
    });
    let s = session(&d, "flood").unwrap();
    assert_eq!(s["ended"][1], "clean", "{s}");

    // Every line is either a sample or a counted drop; the accepted ones fit the bucket: a
    // burst of two seconds' worth plus the rate over the run.
    let accepted = s["samples"].as_u64().unwrap();
    let m = d.metrics();
    let dropped = sample(&m, "gpumon_ingest_rejected_total{code=\"rate_limited\"}").unwrap() as u64;
    assert_eq!(
        accepted + dropped,
        sent,
        "accepted {accepted}, dropped {dropped}"
    );
    let cap = 400.0 + 200.0 * (elapsed + 0.2);
    assert!((accepted as f64) <= cap, "accepted {accepted} > {cap}");
    assert!(accepted >= 400 + 200 * 2, "accepted {accepted}");

    // A notice at most once a second, not one per dropped line; then silence.
    flood_r
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut notices = Vec::new();
    let mut line = String::new();
    while flood_r.read_line(&mut line).is_ok_and(|n| n > 0) {
        notices.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
        line.clear();
    }
    eprintln!(
        "sent {sent} in {elapsed:.2} s: accepted {accepted}, dropped {dropped}, {} notice(s)",
        notices.len()
    );
    assert!(
        (1..=4).contains(&notices.len()),
        "{} notices: {notices:?}",
        notices.len()
    );
    for n in &notices {
        assert_eq!(n["code"], "rate_limited", "{n}");
        let msg = n["message"].as_str().unwrap();
        assert!(
            msg.contains("200 lines/s") && msg.contains("stays open"),
            "{msg}"
        );
    }

    // No crash finding for a throttled trainer, and the calm one was not touched.
    let snap = d.snapshot();
    let crashes: Vec<_> = snap["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "crash")
        .collect();
    assert!(crashes.is_empty(), "{crashes:?}");
    calm.write_all(sample_line(1, 5, 0).as_bytes()).unwrap();
    d.wait_for(Duration::from_secs(5), "calm session's sample", || {
        session(&d, "calm").is_some_and(|s| s["samples"] == 1 && s["ended"].is_null())
    });
    assert_silent(&mut calm_r);
}

#[test]
fn past_the_connection_cap_a_client_gets_the_limit_named_and_others_are_unaffected() {
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&scenario("two_gpus")),
        config: "[ingest]\nmax_connections = 2\nreserved_connections = 1\n".into(),
        ..DaemonOpts::default()
    });
    let (mut a, mut a_r) = connect(&d);
    a.write_all(hello("a").as_bytes()).unwrap();
    assert_eq!(reply(&mut a_r)["type"], "welcome");
    // Both said hello: a connection still without one would give its slot up instead.
    let (mut b, mut b_r) = connect(&d);
    b.write_all(hello("b").as_bytes()).unwrap();
    assert_eq!(reply(&mut b_r)["type"], "welcome");
    d.wait_for(Duration::from_secs(5), "two connections", || {
        sample(&d.metrics(), "gpumon_ingest_connections") == Some(2.0)
    });

    let (_c, mut c_r) = connect(&d);
    let e = reply(&mut c_r);
    assert_eq!(e["type"], "error");
    assert_eq!(e["code"], "too_many_connections");
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("ingest.max_connections") && msg.contains('2'),
        "{msg}"
    );
    let mut rest = String::new();
    assert_eq!(c_r.read_line(&mut rest).unwrap(), 0, "closed after: {rest}");
    let m = d.metrics();
    assert_eq!(
        sample(
            &m,
            "gpumon_ingest_rejected_total{code=\"too_many_connections\"}"
        ),
        Some(1.0)
    );
    assert_eq!(sample(&m, "gpumon_ingest_connections"), Some(2.0));

    // The connections inside the cap carry on, and a freed slot is usable again.
    a.write_all(sample_line(1, 10, 0).as_bytes()).unwrap();
    d.wait_for(Duration::from_secs(5), "a's sample", || {
        session(&d, "a").is_some_and(|s| s["samples"] == 1)
    });
    assert_silent(&mut a_r);
    drop((b, b_r));
    d.wait_for(Duration::from_secs(5), "b's slot freed", || {
        sample(&d.metrics(), "gpumon_ingest_connections") == Some(1.0)
    });
    let (mut e2, mut e2_r) = connect(&d);
    e2.write_all(hello("late").as_bytes()).unwrap();
    assert_eq!(reply(&mut e2_r)["type"], "welcome");
}

#[test]
fn a_client_that_never_reads_costs_dropped_replies_not_a_stuck_daemon() {
    let d = Daemon::with_scenario("two_gpus");
    let (mut calm, mut calm_r) = connect(&d);
    calm.write_all(hello("calm").as_bytes()).unwrap();
    assert_eq!(reply(&mut calm_r)["type"], "welcome");

    // Never reads, not even its welcome, and earns an error reply per line until the socket
    // buffer is full. Batches stay under the 1000 lines/s limit so only deafness is at play.
    let (mut deaf, _never_read) = connect(&d);
    deaf.write_all(hello("deaf").as_bytes()).unwrap();
    let bad = format!("{{\"type\":\"{}\"}}\n", "x".repeat(70));
    let batch = bad.repeat(400);
    let mut sent = 0;
    d.wait_for(Duration::from_secs(15), "replies dropped", || {
        deaf.write_all(batch.as_bytes()).unwrap();
        sent += 400;
        std::thread::sleep(Duration::from_millis(450));
        sample(&d.metrics(), "gpumon_ingest_replies_dropped_total").unwrap() > 0.0
    });
    d.wait_for(Duration::from_secs(5), "every bad line counted", || {
        sample(
            &d.metrics(),
            "gpumon_ingest_rejected_total{code=\"unknown_type\"}",
        ) == Some(sent as f64)
    });
    assert_eq!(
        sample(
            &d.metrics(),
            "gpumon_ingest_rejected_total{code=\"rate_limited\"}"
        ),
        Some(0.0)
    );

    // The deaf connection is still served (not closed, not stalled), and so is everyone else.
    deaf.write_all(sample_line(1, 10, 0).as_bytes()).unwrap();
    calm.write_all(sample_line(1, 20, 0).as_bytes()).unwrap();
    d.wait_for(Duration::from_secs(5), "both samples", || {
        ["deaf", "calm"]
            .iter()
            .all(|j| session(&d, j).is_some_and(|s| s["samples"] == 1 && s["ended"].is_null()))
    });
    assert_silent(&mut calm_r);
    assert_eq!(d.get("/healthz").0, 200);
}

#[test]
fn lines_a_client_reports_dropped_are_counted() {
    let d = Daemon::with_scenario("two_gpus");
    assert_eq!(
        sample(&d.metrics(), "gpumon_ingest_dropped_total"),
        Some(0.0)
    );
    let (mut w, mut r) = connect(&d);
    w.write_all(hello("dropper").as_bytes()).unwrap();
    assert_eq!(reply(&mut r)["type"], "welcome");
    // The reference client's mark after a reconnect, when its buffer overflowed meanwhile.
    for n in [17, 5] {
        let mark = format!(
            "{{\"type\":\"event\",\"ts\":1763700000,\"kind\":\"mark\",\"detail\":\"gpumon-client dropped {n} line(s) while the daemon was unreachable\",\"dropped\":{n}}}\n"
        );
        w.write_all(mark.as_bytes()).unwrap();
    }
    d.wait_for(Duration::from_secs(5), "the drops counted", || {
        sample(&d.metrics(), "gpumon_ingest_dropped_total") == Some(22.0)
    });
}
