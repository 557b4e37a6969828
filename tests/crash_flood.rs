//! A flood of sessions that close without bye (a scheduler restarting a failing trainer, or a
//! hostile client) against the real daemon: memory stays bounded during and after, crash
//! findings are aggregated per (uid, job) so the snapshot stays small and quick, a well-behaved
//! trainer keeps its round trip, and /healthz answers at once while snapshots are built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// Sessions in the flood. 100,000 in the issue; a fifth here keeps the test quick on a loaded
/// debug build, and what grows per session shows at this count already (docs/operations.md).
const FLOOD: usize = 20_000;
/// Connections open at once: each says hello, reads its welcome, and closes without bye.
const WORKERS: usize = 4;
/// Held crash findings expire this long after the last crash they count: longer than the
/// flood, so that without aggregation every crash would still be held at its end.
const HOLD_S: u64 = 15;

/// The daemon's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

fn hello(job: &str, rank: usize) -> String {
    format!("{{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"{job}\",\"rank\":{rank}}}\n")
}

/// One crashing session: hello, its welcome read (so the daemon has opened the session), one
/// step (so it has a series to keep), EOF.
fn crash_once(d: &Daemon, rank: usize) {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(hello("flood", rank).as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    assert!(line.contains("welcome"), "{line}");
    s.write_all(b"{\"type\":\"sample\",\"ts\":1763700000,\"step\":1,\"stats\":{\"allocated_bytes.all.current\":1000}}\n")
        .unwrap();
}

/// Sessions in the flood: `FLOOD`, or CRASH_FLOOD_SESSIONS to measure the 100,000.
fn flood_size() -> usize {
    std::env::var("CRASH_FLOOD_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FLOOD)
}

/// A trainer that steps every 10 ms; every step it also sends a bad line and times the error
/// reply, which comes back in order after the step's sample has been handled: its round trip.
fn good_trainer(d: &Daemon, stop: &AtomicBool) -> Vec<Duration> {
    let mut w = UnixStream::connect(&d.socket).unwrap();
    w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(w.try_clone().unwrap());
    w.write_all(hello("good", 0).as_bytes()).unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("welcome"), "{line}");
    let mut rtt = Vec::new();
    let mut step = 0u64;
    while !stop.load(Ordering::Relaxed) {
        step += 1;
        let sample = format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":1000}}}}\n",
            1_763_700_000 + step
        );
        let t = Instant::now();
        w.write_all(format!("{sample}{{oops\n").as_bytes()).unwrap();
        line.clear();
        r.read_line(&mut line).unwrap();
        rtt.push(t.elapsed());
        assert!(line.contains("bad_json"), "{line}");
        std::thread::sleep(Duration::from_millis(10));
    }
    w.write_all(b"{\"type\":\"bye\",\"ts\":1763800000}\n")
        .unwrap();
    rtt
}

fn p99(mut v: Vec<Duration>) -> Duration {
    assert!(!v.is_empty());
    v.sort();
    v[(v.len() * 99 / 100).min(v.len() - 1)]
}

fn crash_findings(snap: &serde_json::Value) -> Vec<&serde_json::Value> {
    snap["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "crash" && f["state"] == "firing")
        .collect()
}

#[test]
fn a_crash_flood_keeps_memory_snapshots_and_the_good_trainer_bounded() {
    let flood = flood_size();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&scenario("two_gpus")),
        config: format!("[detect]\ncrash_hold = \"{HOLD_S}s\"\n"),
        ..DaemonOpts::default()
    });
    let pid = d.pid();
    // Warm up what a normal run allocates once (a snapshot, /metrics, a session).
    crash_once(&d, 0);
    d.snapshot();
    d.metrics();
    std::thread::sleep(Duration::from_millis(300));
    let start_rss = rss(pid);

    let stop = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let peak = Mutex::new(start_rss);
    let snaps: Mutex<Vec<(usize, Duration)>> = Mutex::new(Vec::new());
    let started = Instant::now();
    let rtt = std::thread::scope(|sc| {
        let trainer = sc.spawn(|| good_trainer(&d, &stop));
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let (code, body) = d.get("/api/v1/snapshot");
                assert_eq!(code, 200);
                snaps.lock().unwrap().push((body.len(), t.elapsed()));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let mut p = peak.lock().unwrap();
                *p = (*p).max(rss(pid));
                drop(p);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (d, done) = (&d, &done);
                sc.spawn(move || {
                    for i in (w..flood).step_by(WORKERS) {
                        crash_once(d, i + 1);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for f in workers {
            f.join().unwrap();
        }
        // Let the daemon catch up with the last closes before the bystanders stop.
        d.wait_for(Duration::from_secs(20), "every crash counted", || {
            sample(&d.metrics(), "gpumon_findings_total{kind=\"crash\"}")
                .is_some_and(|n| n >= (flood + 1) as f64)
        });
        stop.store(true, Ordering::Relaxed);
        trainer.join().unwrap()
    });
    let flood_s = started.elapsed().as_secs_f64();
    let peak = *peak.lock().unwrap();
    let snaps = snaps.into_inner().unwrap();
    let biggest = snaps.iter().map(|s| s.0).max().unwrap();
    let slowest = snaps.iter().map(|s| s.1).max().unwrap();
    let n_rtt = rtt.len();
    let p99 = p99(rtt);
    eprintln!(
        "flood: {flood} crashes in {flood_s:.1} s; rss start {} MB, peak {} MB; {} snapshots, \
         biggest {biggest} B, slowest {slowest:?}; good trainer p99 {p99:?} over {n_rtt} steps",
        start_rss >> 20,
        peak >> 20,
        snaps.len()
    );

    // Aggregated: a handful of crash findings, every crash counted.
    let snap = d.snapshot();
    let crashes = crash_findings(&snap);
    assert!(
        !crashes.is_empty() && crashes.len() <= 16,
        "{} crash findings firing",
        crashes.len()
    );
    let agg = crashes
        .iter()
        .find(|f| {
            f["message"]
                .as_str()
                .unwrap()
                .contains("sessions of job flood")
        })
        .unwrap_or_else(|| panic!("no aggregated finding: {crashes:#?}"));
    // Crashes of one job that follow its first failure (jobs.md) fold apart from the rest, as
    // warnings: the first failure alone pages.
    let follows = agg["message"]
        .as_str()
        .unwrap()
        .contains("after another rank's failure");
    assert_eq!(
        agg["severity"],
        if follows { "warning" } else { "critical" },
        "{agg:#}"
    );
    let critical = crashes
        .iter()
        .filter(|f| f["severity"] == "critical")
        .count();
    assert!(critical <= 8, "{critical} critical crash findings");
    let m = d.metrics();
    assert!(sample(&m, "gpumon_findings_total{kind=\"crash\"}").unwrap() >= (flood + 1) as f64);
    // A few log lines, not two per crash: the aggregate is one finding.
    let lines = d.logs.lock().unwrap().len();
    assert!(lines < 500, "{lines} log lines");

    assert!(
        peak <= 64 << 20 && peak - start_rss <= 32 << 20,
        "rss peak {} MB (start {} MB)",
        peak >> 20,
        start_rss >> 20
    );
    assert!(biggest <= 1 << 20, "snapshot of {biggest} bytes");
    // No bound on time here: on a loaded 2-core CI machine a debug build's figures say more about
    // the load than the daemon (433 ms for one snapshot once). What keeps the snapshot quick and
    // the trainer's round trip short is the aggregation, bounded above by count and size; the
    // times are scripts/bench-floods' (crash: slowest snapshot and the trainer's p99, checked
    // on a release build), where this test's figures before the bounds were 1.3 s and 1.6 s.
    eprintln!("(times for the record, not checked: slowest snapshot {slowest:?}, p99 {p99:?})");

    let after = rss(pid);
    eprintln!("after the flood, findings held: rss {} MB", after >> 20);
    assert!(
        after <= start_rss + (10 << 20),
        "rss {} MB after the flood, {} MB before",
        after >> 20,
        start_rss >> 20
    );

    // The holds expire and the memory stays where it was.
    d.wait_for(
        Duration::from_secs(HOLD_S + 10),
        "crash findings expired",
        || crash_findings(&d.snapshot()).is_empty(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let end_rss = rss(pid);
    eprintln!("after expiry: rss {} MB", end_rss >> 20);
    assert!(
        end_rss <= start_rss + (10 << 20),
        "rss {} MB after, {} MB before",
        end_rss >> 20,
        start_rss >> 20
    );
}

#[test]
fn healthz_and_metrics_answer_while_snapshots_are_built() {
    let d = Daemon::with_scenario("two_gpus");
    // Enough crashes to make the snapshot work: one job each, so none aggregate.
    for i in 0..200 {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(hello(&format!("job{i}"), 0).as_bytes())
            .unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
    }
    let idle = {
        let t = Instant::now();
        assert_eq!(d.get("/healthz").0, 200);
        t.elapsed()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let snapshot_times = Mutex::new(Vec::new());
    let (health, metrics, codes) = std::thread::scope(|sc| {
        let hammer: Vec<_> = (0..32)
            .map(|_| {
                let (d, stop, times) = (&d, stop.clone(), &snapshot_times);
                sc.spawn(move || {
                    let mut codes = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        codes.push(d.get("/api/v1/snapshot").0);
                        times.lock().unwrap().push(t.elapsed());
                    }
                    codes
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut health = Vec::new();
        let mut metrics = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            assert_eq!(d.get("/healthz").0, 200);
            health.push(t.elapsed());
            let t = Instant::now();
            d.metrics();
            metrics.push(t.elapsed());
            std::thread::sleep(Duration::from_millis(25));
        }
        stop.store(true, Ordering::Relaxed);
        let codes: Vec<u16> = hammer.into_iter().flat_map(|h| h.join().unwrap()).collect();
        (median(health), median(metrics), codes)
    });
    let snapshot = median(snapshot_times.into_inner().unwrap());
    let ok = codes.iter().filter(|c| **c == 200).count();
    eprintln!(
        "healthz idle {idle:?}; medians under 32 snapshot loops: /healthz {health:?}, \
         /metrics {metrics:?}, a snapshot {snapshot:?}; {ok} of {} snapshots served",
        codes.len()
    );
    assert!(codes.iter().all(|c| *c == 200 || *c == 503), "{codes:?}");
    // 200 crash findings each logged "finding firing": over the budget, counted.
    let suppressed = sample(&d.metrics(), "gpumon_log_suppressed_total").unwrap();
    assert!(suppressed >= 100.0, "{suppressed} lines suppressed");
    assert!(d.logs.lock().unwrap().len() < 150);
    assert!(ok > 0);
    // Ratios within one load, not times: /healthz and /metrics wait on no snapshot build, so
    // each answers well within what one snapshot takes under the same 32 loops. Queued behind
    // the builds (the aggregator's one thread), each would take at least a snapshot's time.
    assert!(
        health * 4 <= snapshot,
        "/healthz {health:?} against a snapshot's {snapshot:?}"
    );
    assert!(
        metrics * 2 <= snapshot,
        "/metrics {metrics:?} against a snapshot's {snapshot:?}"
    );
}

fn median(mut v: Vec<Duration>) -> Duration {
    assert!(!v.is_empty());
    v.sort();
    v[v.len() / 2]
}
