//! The HTTP server under hostile clients, against the real daemon on loopback: half-open
//! connections, connect/close storms, oversized heads, shutdown with a request half sent, and
//! gzip. Each test starts its own daemon; they run one at a time (timings are asserted).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{sample, Daemon, DaemonOpts};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn daemon(config: &str, scenario: &str, interval: &str) -> Daemon {
    let path = common::scenario(scenario);
    Daemon::start(DaemonOpts {
        scenario: Some(&path),
        args: vec!["--interval".into(), interval.into()],
        config: config.into(),
        ..DaemonOpts::default()
    })
}

/// Raises this process's open-file limit (the daemon inherits it) to hold `n` sockets.
fn raise_nofile(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert!(
        lim.rlim_max >= n,
        "this test needs {n} open files; the hard limit is {}",
        lim.rlim_max
    );
    lim.rlim_cur = lim.rlim_cur.max(n);
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// One request on its own connection, read to the end: (head, body, seconds taken).
fn raw_get(addr: SocketAddr, path: &str, extra: &str) -> (String, Vec<u8>, f64) {
    let start = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: gpumon\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let took = start.elapsed().as_secs_f64();
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&all[..split]).to_string();
    (head, all[split + 4..].to_vec(), took)
}

fn closed(metrics: &str, reason: &str) -> f64 {
    sample(
        metrics,
        &format!("gpumon_http_connections_closed_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or_else(|| panic!("no closed_total for {reason}"))
}

/// Whether the daemon has closed this connection (EOF or reset), without waiting.
fn is_closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let mut r = s;
    loop {
        match r.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Connections that sent a request line and never finished their headers.
fn half_open(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    half_open_at(addr, n).into_iter().map(|(s, _)| s).collect()
}

/// `half_open`, each connection with when it was opened (before the daemon accepted it, so
/// before its header timeout started).
fn half_open_at(addr: SocketAddr, n: usize) -> Vec<(TcpStream, Instant)> {
    (0..n)
        .map(|i| {
            if i % 200 == 0 {
                drain_accept_queue(addr);
            }
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            let opened = Instant::now();
            s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
            (s, opened)
        })
        .collect()
}

/// Waits (up to a second) until the listener's accept queue is short. The daemon's listener
/// has a backlog of 1024; a client that outruns accept() overflows it, and the kernel then
/// drops SYNs that come back only after a 1 s retransmit, which is not what is tested here.
fn drain_accept_queue(addr: SocketAddr) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) && accept_queue(addr) > 100 {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The accept queue of the listener on `addr` (rx_queue of its LISTEN row in /proc/net/tcp).
fn accept_queue(addr: SocketAddr) -> usize {
    let port = format!(":{:04X}", addr.port());
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let listening = f.get(1)?.ends_with(&port) && *f.get(3)? == "0A";
            let rx = f.get(4)?.split(':').nth(1)?;
            listening.then(|| usize::from_str_radix(rx, 16).ok())?
        })
        .next()
        .unwrap_or(0)
}

/// Per held connection, at most: hyper's first read buffer (8 KiB) plus its connection state,
/// the task and allocator slack; measured at about 15 KiB. The bound of docs/operations.md.
const KIB_PER_HELD_CONNECTION: u64 = 20;

#[test]
fn half_open_connections_are_closed_by_the_header_timeout_and_scrapes_stay_fast() {
    let _one = serial();
    const N: usize = 3000;
    // Long enough that all 3,000 are open at once before the first is due: opening them took
    // 2.3 s alone, 5.7 s on a loaded 2-core machine, 11.3 and 13.3 s after the connect/close
    // storm test on a busy one.
    const TIMEOUT: Duration = Duration::from_secs(24);
    raise_nofile(N as u64 * 2 + 512);
    let d = daemon(
        &format!(
            "[http]\nheader_timeout_seconds = {}\nconnection_limit = 4000\n",
            TIMEOUT.as_secs()
        ),
        "two_gpus",
        "100ms",
    );
    for _ in 0..3 {
        raw_get(d.addr, "/metrics", "");
    }
    let idle_rss = rss_kib(d.pid());

    let sent = Instant::now();
    let held_at = half_open_at(d.addr, N);
    let (held, opened): (Vec<TcpStream>, Vec<Instant>) = held_at.into_iter().unzip();
    let opened_in = sent.elapsed();
    let last_sent = Instant::now();
    // Scrapes while they are held: each on a new connection, each well under 50 ms.
    let mut worst = 0.0f64;
    let mut peak_open = 0.0f64;
    // At least 5 scrapes, and on until every half-open one is accepted: a loaded machine takes
    // longer to drain the accept queue (well inside the header timeout, which would close them).
    let mut scrapes = 0;
    while scrapes < 5 || (peak_open < N as f64 && last_sent.elapsed() < TIMEOUT / 2) {
        let (head, body, took) = raw_get(d.addr, "/metrics", "");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        worst = worst.max(took);
        let text = String::from_utf8(body).unwrap();
        peak_open = peak_open.max(sample(&text, "gpumon_http_connections").unwrap());
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(150));
    }
    let held_rss = rss_kib(d.pid());
    eprintln!(
        "{N} half-open: opened in {opened_in:?}; scrape worst {:.1} ms; open {peak_open}; RSS {idle_rss} -> {held_rss} KiB",
        worst * 1e3
    );
    assert!(peak_open >= N as f64, "only {peak_open} open");
    // A deadline, not a benchmark (a loaded CI machine is slow, not stuck): a scrape that found
    // no slot would wait for a half-open one's header timeout (24 s here) or be refused.
    assert!(worst < 2.5, "a scrape took {:.1} ms", worst * 1e3);
    assert!(
        held_rss <= 2 * idle_rss + KIB_PER_HELD_CONNECTION * N as u64,
        "RSS {idle_rss} -> {held_rss} KiB"
    );

    // None closed before its header timeout: each connection judged by its own (a loaded
    // machine opens the last ones seconds after the first)...
    let now = Instant::now();
    let not_due: Vec<&TcpStream> = held
        .iter()
        .zip(&opened)
        .filter(|(_, at)| now + Duration::from_millis(200) < **at + TIMEOUT)
        .map(|(s, _)| s)
        .collect();
    assert!(
        not_due.len() >= N / 4,
        "only {} of {N} still short of their timeout: opening them took {opened_in:?}",
        not_due.len()
    );
    let early = not_due.iter().filter(|s| is_closed(s)).count();
    assert_eq!(early, 0, "{early} closed before their timeout");
    // ...and all closed by it, with two seconds of slack for 3,000 timers.
    let deadline = last_sent + TIMEOUT + Duration::from_secs(2);
    let mut open = N;
    while Instant::now() < deadline {
        open = held.iter().filter(|s| !is_closed(s)).count();
        if open == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let closed_after = last_sent.elapsed();
    assert_eq!(open, 0, "{open} still open after {closed_after:?}");
    assert!(
        closed_after < TIMEOUT + Duration::from_secs(2),
        "{closed_after:?}"
    );
    let m = d.metrics();
    assert!(closed(&m, "header_timeout") >= N as f64, "{m}");
    assert_eq!(sample(&m, "gpumon_http_connections"), Some(1.0));
    eprintln!(
        "closed after {closed_after:?}; RSS now {} KiB",
        rss_kib(d.pid())
    );
}

#[test]
fn at_the_default_cap_half_open_connections_give_way_and_scrapes_get_in() {
    let _one = serial();
    const N: usize = 1000;
    const CAP: usize = 512; // the default `http.connection_limit`
    raise_nofile(N as u64 * 2 + 512);
    let d = daemon("", "two_gpus", "100ms");
    for _ in 0..3 {
        raw_get(d.addr, "/metrics", "");
    }
    let idle_rss = rss_kib(d.pid());
    // A keep-alive scraper that has been served once: idle, it gives way only after every
    // connection that never completed a request.
    let mut scraper = TcpStream::connect(d.addr).unwrap();
    scraper
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let keep_alive = |s: &mut TcpStream| {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: gpumon\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    assert!(keep_alive(&mut scraper).starts_with("HTTP/1.1 200"));

    // Scrapes interleaved with the flood, each on a new connection: none refused, each fast.
    let mut held = Vec::new();
    let mut worst = 0.0f64;
    for chunk in 0..10 {
        held.extend(half_open(d.addr, N / 10));
        let (head, _, took) = raw_get(d.addr, "/metrics", "");
        assert!(head.starts_with("HTTP/1.1 200"), "scrape {chunk}: {head}");
        worst = worst.max(took);
    }
    std::thread::sleep(Duration::from_millis(300));
    let held_rss = rss_kib(d.pid());
    let gave_way = held.iter().filter(|s| is_closed(s)).count();
    let m = d.metrics();
    eprintln!(
        "{N} half-open at cap {CAP}: {gave_way} gave way; scrape worst {:.1} ms; RSS {idle_rss} -> {held_rss} KiB",
        worst * 1e3
    );
    // The oldest gave way, the newest are held, and the idle scraper kept its connection.
    assert!(gave_way >= N - CAP, "only {gave_way} gave way");
    assert!(held[..N - CAP].iter().all(is_closed), "the oldest go first");
    assert!(!is_closed(&held[N - 1]), "the newest is held");
    assert!(keep_alive(&mut scraper).starts_with("HTTP/1.1 200"));
    // A deadline, not a benchmark (a loaded CI machine is slow, not stuck): a scrape that found
    // no slot would wait for a half-open one's header timeout (10 s) or be refused.
    assert!(worst < 2.5, "a scrape took {:.1} ms", worst * 1e3);
    assert!(sample(&m, "gpumon_http_connections").unwrap() <= (CAP + 1) as f64);
    assert!(closed(&m, "evicted") >= (N - CAP) as f64, "{m}");
    assert_eq!(closed(&m, "over_cap"), 0.0, "{m}");
    // Memory held is bounded by the cap, whatever N is.
    assert!(
        held_rss <= 2 * idle_rss + KIB_PER_HELD_CONNECTION * CAP as u64,
        "RSS {idle_rss} -> {held_rss} KiB"
    );
}

#[test]
fn rapid_connect_close_cycles_leave_the_daemon_serving_with_its_fds_back() {
    let _one = serial();
    let d = daemon("", "two_gpus", "100ms");
    d.metrics();
    let idle = fds(d.pid());
    let start = Instant::now();
    for i in 0..10_000 {
        if i % 200 == 0 {
            drain_accept_queue(d.addr);
        }
        drop(TcpStream::connect(d.addr).unwrap());
    }
    eprintln!("10000 cycles in {:?}", start.elapsed());
    let (head, _, took) = raw_get(d.addr, "/metrics", "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Stuck behind the cycles' leftovers, it would wait for a header timeout (10 s).
    assert!(took < 2.5, "{took}");
    d.wait_for(Duration::from_secs(5), "fds back near idle", || {
        fds(d.pid()) <= idle + 4
    });
    let m = d.metrics();
    assert!(closed(&m, "done") >= 10_000.0, "{m}");
}

#[test]
fn megabyte_headers_and_urls_are_refused_and_counted() {
    let _one = serial();
    let d = daemon("", "two_gpus", "100ms");
    let big = "a".repeat(1 << 20);
    for request in [
        format!("GET /metrics HTTP/1.1\r\nHost: gpumon\r\nX-Big: {big}\r\n\r\n"),
        format!("GET /metrics?{big} HTTP/1.1\r\nHost: gpumon\r\n\r\n"),
    ] {
        let mut s = TcpStream::connect(d.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The daemon stops reading at 16 KiB, so the write may fail half way: that is the point.
        let _ = s.write_all(request.as_bytes());
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        // A 431 when it arrives before the reset that the unread bytes cause; never a 200.
        let head = String::from_utf8_lossy(&reply[..reply.len().min(64)]).to_string();
        assert!(
            reply.is_empty()
                || head.starts_with("HTTP/1.1 431")
                || head.starts_with("HTTP/1.1 414"),
            "{head}"
        );
    }
    let m = d.metrics();
    assert_eq!(closed(&m, "too_large"), 2.0, "{m}");
    // A head just under the cap is served.
    let (head, _, _) = raw_get(
        d.addr,
        "/healthz",
        &format!("X-Ok: {}\r\n", "b".repeat(12_000)),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[test]
fn sigterm_with_a_half_sent_request_exits_within_the_drain_deadline() {
    let _one = serial();
    // The header timeout is longer than the test, so only the shutdown can close these.
    let mut d = daemon(
        "[http]\nheader_timeout_seconds = 60\nshutdown_grace_seconds = 3\n",
        "two_gpus",
        "100ms",
    );
    let mut half = half_open(d.addr, 1).remove(0);
    half.write_all(b"Host: gpumon\r\nX-Slow: ").unwrap();
    // A keep-alive connection that finished one request and sits idle.
    let mut idle = TcpStream::connect(d.addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: gpumon\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // A slow client keeps trickling header bytes while the daemon drains.
    let mut slow = half_open(d.addr, 1).remove(0);
    let trickle = std::thread::spawn(move || {
        for _ in 0..40 {
            if slow.write_all(b"x").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let start = Instant::now();
    let status = d.signal_and_wait(libc::SIGTERM, Duration::from_secs(5));
    let took = start.elapsed();
    assert!(status.is_some(), "still running {took:?} after SIGTERM");
    assert!(status.unwrap().success(), "{status:?}");
    eprintln!("exited {took:?} after SIGTERM");
    assert!(is_closed(&half));
    trickle.join().unwrap();
}

#[test]
fn gzip_is_the_plain_text_compressed() {
    let _one = serial();
    // A long interval, so both scrapes see the same collection.
    let d = daemon("", "eight_gpus_128", "30s");
    let (plain_head, plain, _) = raw_get(d.addr, "/metrics", "");
    let (gz_head, gz, _) = raw_get(d.addr, "/metrics", "Accept-Encoding: gzip, deflate\r\n");
    let lower = gz_head.to_ascii_lowercase();
    assert!(lower.contains("content-encoding: gzip"), "{gz_head}");
    assert!(lower.contains("vary: accept-encoding"), "{gz_head}");
    assert!(
        !plain_head.to_ascii_lowercase().contains("content-encoding"),
        "{plain_head}"
    );
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    // The HTTP counters moved between the two scrapes (the first one closed), and the
    // aggregator's busy time (each scrape syncs with it); all else is the same collection.
    let strip = |t: &str| -> String {
        t.lines()
            .filter(|l| !l.starts_with("gpumon_http_connections"))
            .filter(|l| !l.starts_with("gpumon_aggregator_busy_seconds_total"))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let plain = String::from_utf8(plain).unwrap();
    assert!(plain.contains("gpumon_http_connections_closed_total"));
    assert_eq!(strip(&text), strip(&plain));
    eprintln!("/metrics: {} bytes plain, {} gzip", plain.len(), gz.len());
    assert!(
        gz.len() * 8 < plain.len(),
        "{} of {}",
        gz.len(),
        plain.len()
    );
    // Refusing gzip gets the text.
    let (head, _, _) = raw_get(d.addr, "/metrics", "Accept-Encoding: gzip;q=0\r\n");
    assert!(
        !head.to_ascii_lowercase().contains("content-encoding"),
        "{head}"
    );
}
