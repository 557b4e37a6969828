//! Scrapes first under load (issue 23 item 2), against the real daemon on loopback with
//! `connection_limit = 32`: floods from 127.0.0.2 (wrong passwords, busy API clients,
//! pipelining clients that never read) while a scraper on 127.0.0.1 opens a new connection
//! per scrape, as the hardest case. Each flood runs a few seconds; they run one at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
// The flood tool's connections from another peer and its response reader, shared.
#[allow(dead_code)]
#[path = "../crates/loadgen/src/flood_http.rs"]
mod flood_http;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{sample, Daemon, DaemonOpts};
use flood_http::{connect_from_other_peer, read_response};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const LIMIT: usize = 32;
/// Flooding connections: more than the limit, so every slot is contested.
const FLOODERS: usize = 40;
const SCRAPES: usize = 20;
const PASSWORD: &str = "right horse battery";

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn daemon(extra: &str) -> Daemon {
    daemon_with_limit(LIMIT, extra)
}

fn daemon_with_limit(limit: usize, extra: &str) -> Daemon {
    let path = common::scenario("two_gpus");
    Daemon::start(DaemonOpts {
        scenario: Some(&path),
        config: format!("[http]\nconnection_limit = {limit}\n{extra}"),
        ..DaemonOpts::default()
    })
}

/// `SCRAPES` scrapes of /metrics, each on a new connection from 127.0.0.1, 150 ms apart:
/// how many got a 200 within a second of connecting.
fn scrape(addr: SocketAddr, auth: &str) -> usize {
    let mut answered = 0;
    for _ in 0..SCRAPES {
        let start = Instant::now();
        let ok = (|| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
            write!(
                s,
                "GET /metrics HTTP/1.1\r\nHost: gpumon\r\nAccept-Encoding: gzip\r\n{auth}\r\n"
            )
            .ok()?;
            read_response(&mut s)
        })();
        if ok == Some(200) && start.elapsed() < Duration::from_secs(1) {
            answered += 1;
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    answered
}

/// Runs `client` on `flooders` threads until the scraper is done; returns the scraper's count.
fn flood_while_scraping(
    flooders: usize,
    addr: SocketAddr,
    auth: &str,
    client: impl Fn(usize, &AtomicBool) + Send + Sync + 'static,
) -> usize {
    let stop = Arc::new(AtomicBool::new(false));
    let client = Arc::new(client);
    let threads: Vec<_> = (0..flooders)
        .map(|i| {
            let (stop, client) = (stop.clone(), client.clone());
            std::thread::spawn(move || client(i, &stop))
        })
        .collect();
    // Let the flood take every slot first.
    std::thread::sleep(Duration::from_millis(700));
    let answered = scrape(addr, auth);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    answered
}

/// /metrics, uncompressed, read to its end.
fn metrics(addr: SocketAddr, auth: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: gpumon\r\nConnection: close\r\n{auth}\r\n"
    )
    .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    assert!(all.starts_with("HTTP/1.1 200"), "{all}");
    all
}

fn report(case: &str, answered: usize, metrics: &str) {
    let series = |name: &str, reason: &str| {
        sample(metrics, &format!("{name}{{reason=\"{reason}\"}}")).unwrap_or(-1.0)
    };
    eprintln!(
        "{case}: {answered}/{SCRAPES} scrapes answered within 1 s; denied auth_throttled {} unauthorized {} busy {}; evicted unread_output {} auth_failed {} unproven {} idle {} over_share {}; over_cap {}",
        series("gpumon_http_requests_denied_total", "auth_throttled"),
        series("gpumon_http_requests_denied_total", "unauthorized"),
        series("gpumon_http_requests_denied_total", "busy"),
        series("gpumon_http_connections_evicted_total", "unread_output"),
        series("gpumon_http_connections_evicted_total", "auth_failed"),
        series("gpumon_http_connections_evicted_total", "unproven"),
        series("gpumon_http_connections_evicted_total", "idle"),
        series("gpumon_http_connections_evicted_total", "over_share"),
        series("gpumon_http_connections_closed_total", "over_cap"),
    );
}

fn at_least_90_percent(answered: usize) {
    assert!(
        answered * 10 >= SCRAPES * 9,
        "only {answered} of {SCRAPES} scrapes answered within 1 s"
    );
}

#[test]
fn a_wrong_password_flood_is_throttled_and_the_scraper_is_answered() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    // Started open (the harness waits for /readyz), then basic auth is turned on by a reload.
    std::fs::write(
        &web,
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
    )
    .unwrap();
    let d = daemon(&format!("web_config_file = {:?}\n", web.to_str().unwrap()));
    let hash = bcrypt::hash(PASSWORD, 8).unwrap();
    std::fs::write(&web, format!("basic_auth_users:\n  scraper: \"{hash}\"\n")).unwrap();
    unsafe { libc::kill(d.pid() as i32, libc::SIGHUP) };
    d.wait_for(Duration::from_secs(10), "basic auth on", || {
        d.get("/healthz").0 == 401
    });
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let auth = format!(
        "Authorization: Basic {}\r\n",
        b64(&format!("scraper:{PASSWORD}"))
    );
    let addr = d.addr;
    let answered = flood_while_scraping(FLOODERS, addr, &auth, move |i, stop| {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let Some(mut s) = connect_from_other_peer(addr, None) else {
                continue;
            };
            // Keep-alive, a new wrong password each request, until the daemon closes it.
            loop {
                n += 1;
                let wrong = b64(&format!("scraper:guess-{i}-{n}"));
                let req = format!(
                    "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {wrong}\r\n\r\n"
                );
                if stop.load(Ordering::Relaxed)
                    || s.write_all(req.as_bytes()).is_err()
                    || read_response(&mut s).is_none()
                {
                    break;
                }
            }
        }
    });
    let m = metrics(addr, &auth);
    report("wrong-password flood", answered, &m);
    at_least_90_percent(answered);
    assert!(
        sample(
            &m,
            "gpumon_http_requests_denied_total{reason=\"auth_throttled\"}"
        )
        .unwrap()
            > 0.0
    );
}

#[test]
fn busy_api_clients_are_bounded_and_the_scraper_is_answered() {
    let _one = serial();
    // More connections than the API serves and queues (4 + 32), so some are refused 503.
    let d = daemon_with_limit(64, "");
    let addr = d.addr;
    let answered = flood_while_scraping(60, addr, "", move |_, stop| {
        while !stop.load(Ordering::Relaxed) {
            let Some(mut s) = connect_from_other_peer(addr, None) else {
                continue;
            };
            // Keep-alive, one snapshot after another, until the daemon closes it.
            let req = b"GET /api/v1/snapshot HTTP/1.1\r\nHost: x\r\n\r\n";
            while !stop.load(Ordering::Relaxed)
                && s.write_all(req).is_ok()
                && read_response(&mut s).is_some()
            {}
        }
    });
    let m = metrics(addr, "");
    report("busy API clients", answered, &m);
    at_least_90_percent(answered);
    assert!(sample(&m, "gpumon_http_requests_denied_total{reason=\"busy\"}").unwrap() > 0.0);
}

#[test]
fn pipelining_clients_that_never_read_give_way_and_the_scraper_is_answered() {
    let _one = serial();
    let d = daemon("");
    let addr = d.addr;
    let answered = flood_while_scraping(FLOODERS, addr, "", move |_, stop| {
        // 100 snapshot requests in one write, a 1 KiB receive buffer, nothing ever read; a
        // fresh such connection every second, the old ones held open.
        let burst = "GET /api/v1/snapshot HTTP/1.1\r\nHost: x\r\n\r\n".repeat(100);
        let mut held = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Some(mut s) = connect_from_other_peer(addr, Some(1024)) {
                let _ = s.write_all(burst.as_bytes());
                held.push(s);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let m = metrics(addr, "");
    report("pipelining, never reading", answered, &m);
    at_least_90_percent(answered);
}

#[test]
fn connections_whose_output_goes_unread_give_way_first_and_are_closed() {
    let _one = serial();
    // A header timeout longer than the wait below: a stalled connection is closed on its own
    // deadline, not on the later one its watcher computed before the stall.
    let d = daemon("keepalive_timeout_seconds = 4\nheader_timeout_seconds = 60\n");
    let addr = d.addr;
    // Every slot taken by a connection that pipelined 100 scrapes (far more than its socket
    // buffers hold) behind a 1 KiB receive buffer and reads nothing.
    let burst = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(100);
    let held: Vec<TcpStream> = (0..LIMIT)
        .filter_map(|_| {
            let mut s = connect_from_other_peer(addr, Some(1024))?;
            s.write_all(burst.as_bytes()).ok()?;
            Some(s)
        })
        .collect();
    assert_eq!(held.len(), LIMIT);
    // Past the 1 s a stalled write takes to count as unread output.
    std::thread::sleep(Duration::from_millis(1500));
    let answered = scrape(addr, "");
    let m = metrics(addr, "");
    report("pipelined scrapes never read", answered, &m);
    assert_eq!(answered, SCRAPES);
    // Each scrape closes its own connection, so one eviction makes room for all of them: one of
    // the flood's (stalled, or, on a loaded machine, one whose first response is not out yet),
    // never an idle one.
    let evicted = |why: &str| {
        sample(
            &m,
            &format!("gpumon_http_connections_evicted_total{{reason=\"{why}\"}}"),
        )
        .unwrap()
    };
    assert!(evicted("unread_output") + evicted("unproven") >= 1.0);
    assert_eq!(evicted("idle"), 0.0);
    // Unread for the keep-alive timeout (4 s), the rest are closed; the bound leaves room for a
    // machine busy with other tests.
    d.wait_for(Duration::from_secs(15), "unread_output closes", || {
        let m = metrics(addr, "");
        let closed = "gpumon_http_connections_closed_total{reason=\"unread_output\"}";
        sample(&m, closed).unwrap() >= (LIMIT - 1) as f64
    });
    drop(held);
}
