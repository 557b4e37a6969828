//! The HTTP floods of gpumon-flood: clients from another address (127.0.0.2) than the scraper's
//! (127.0.0.1) keep the daemon's HTTP side busy while a scraper opens a new connection per
//! scrape of /metrics, once a second; what counts is how many scrapes are answered (200 within
//! 2 s) and how long they take.
//!   http-auth:     clients looping GET /metrics, each request with a new wrong password;
//!   http-snapshot: keep-alive clients looping GET /api/v1/snapshot;
//!   http-pipeline: connections each pipelining 100 snapshot requests with a 1 KB receive
//!                  buffer, never reading.
//! tests/http_flood.rs floods with the same connections and reads (it includes this file).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Http {
    Auth,
    Snapshot,
    Pipeline,
}

pub struct Outcome {
    pub scrapes: usize,
    pub answered: usize,
    pub latencies: Vec<Duration>,
    pub flood_requests: u64,
}

/// An Authorization header's value for `user:password`.
pub fn basic(user_password: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(user_password);
    format!("Basic {b64}")
}

/// A basic-auth header line for `user:password`.
pub fn auth_header(user_password: &str) -> String {
    format!("Authorization: {}\r\n", basic(user_password))
}

/// A web config file's text that asks basic auth of `user` with `password` (bcrypt, cost 8).
pub fn web_config(user: &str, password: &str) -> anyhow::Result<String> {
    let hash = bcrypt::hash(password, 8).context("bcrypt")?;
    Ok(format!("basic_auth_users:\n  {user}: \"{hash}\"\n"))
}

/// A connection from 127.0.0.2, with a receive buffer of `rcvbuf` bytes when given (set
/// before connecting, so the window stays that small).
pub fn connect_from_other_peer(addr: SocketAddr, rcvbuf: Option<i32>) -> Option<TcpStream> {
    let SocketAddr::V4(to) = addr else {
        return None;
    };
    // SAFETY: a fresh socket owned by the TcpStream from here on; the option and addresses
    // are plain values of the sizes given.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let s = TcpStream::from_raw_fd(fd);
        if let Some(n) = rcvbuf {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&n as *const i32).cast(),
                4,
            );
        }
        let sin = |ip: [u8; 4], port: u16| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(ip),
            },
            sin_zero: [0; 8],
        };
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let local = sin([127, 0, 0, 2], 0);
        if libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) != 0 {
            return None;
        }
        let remote = sin(to.ip().octets(), to.port());
        if libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) != 0 {
            return None;
        }
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
        Some(s)
    }
}

/// Reads one response (head and Content-Length body): its status, or None if the connection
/// failed or closed.
pub fn read_response(s: &mut TcpStream) -> Option<u16> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let status = head.get(9..12)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some(status)
}

/// One scrape of /metrics on a new connection: its time when answered 200 within 2 s.
fn scrape(addr: SocketAddr, auth: &str) -> Option<Duration> {
    let start = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: gpumon\r\nAccept-Encoding: gzip\r\n{auth}\r\n"
    )
    .ok()?;
    let ok = read_response(&mut s) == Some(200);
    let took = start.elapsed();
    (ok && took < Duration::from_secs(2)).then_some(took)
}

/// One flooding client until `stop`.
fn flooder(kind: Http, addr: SocketAddr, i: usize, stop: &AtomicBool, sent: &AtomicU64) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let rcvbuf = (kind == Http::Pipeline).then_some(1024);
        let Some(mut s) = connect_from_other_peer(addr, rcvbuf) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if kind == Http::Pipeline {
            let one = "GET /api/v1/snapshot HTTP/1.1\r\nHost: x\r\n\r\n";
            let _ = s.write_all(one.repeat(100).as_bytes());
            sent.fetch_add(100, Ordering::Relaxed);
            // Never read: wait until the daemon closes it (the write side then fails).
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                if s.write_all(b"\r\n").is_err() {
                    break;
                }
            }
            continue;
        }
        // Keep-alive until the daemon closes the connection.
        loop {
            n += 1;
            let req = match kind {
                Http::Auth => format!(
                    "GET /metrics HTTP/1.1\r\nHost: x\r\n{}\r\n",
                    auth_header(&format!("scraper:guess-{i}-{n}"))
                ),
                _ => "GET /api/v1/snapshot HTTP/1.1\r\nHost: x\r\n\r\n".to_string(),
            };
            if stop.load(Ordering::Relaxed) || s.write_all(req.as_bytes()).is_err() {
                break;
            }
            sent.fetch_add(1, Ordering::Relaxed);
            if read_response(&mut s).is_none() {
                break;
            }
        }
    }
}

/// Runs `clients` flooding clients for `secs` seconds while scraping once a second.
pub fn run(
    kind: Http,
    addr: SocketAddr,
    clients: usize,
    secs: u64,
    scraper_auth: &str,
) -> anyhow::Result<Outcome> {
    if scrape(addr, scraper_auth).is_none() {
        bail!("the scraper is not answered before the flood: check --api and --password");
    }
    let stop = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let (scrapes, latencies) = std::thread::scope(|sc| {
        for i in 0..clients {
            let (stop, sent) = (&stop, &sent);
            sc.spawn(move || flooder(kind, addr, i, stop, sent));
        }
        // Let the flood take hold first.
        std::thread::sleep(Duration::from_secs(2));
        let mut scrapes = 0;
        let mut latencies = Vec::new();
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            let t = Instant::now();
            scrapes += 1;
            if let Some(took) = scrape(addr, scraper_auth) {
                latencies.push(took);
            }
            std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
        }
        stop.store(true, Ordering::Relaxed);
        (scrapes, latencies)
    });
    Ok(Outcome {
        scrapes,
        answered: latencies.len(),
        latencies,
        flood_requests: sent.load(Ordering::Relaxed),
    })
}
