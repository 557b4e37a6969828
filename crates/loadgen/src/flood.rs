//! gpumon-flood: the floods a hostile or broken client can throw at the ingest socket, run
//! against a live daemon while its memory is watched, so that what the daemon keeps during a
//! flood and gives back after it is measured, not guessed (docs/operations.md quotes it).
//!   crash:       sessions that say hello, send one step and close without bye;
//!   hello-close: sessions that say hello and close at once;
//!   partial:     connections that say hello, then hold a line they never finish;
//!   http-auth, http-snapshot, http-pipeline: HTTP floods, with a scraper counting the scrapes
//!                answered (flood_http.rs).
//! Beside the flood a well-behaved trainer steps every 10 ms and times its round trip, and a
//! scraper takes /api/v1/snapshot every 50 ms. Exit status 1 when a --max-* bound is passed.
//! `gpumon-flood web-config --password P` prints a web config asking basic auth (user
//! `scraper`), for the daemon of an http-auth flood.

// Shared with gpumon-loadgen, which uses more of it.
#[allow(dead_code)]
#[path = "daemon.rs"]
mod daemon;
mod flood_http;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Kind {
    Crash,
    HelloClose,
    Partial,
    HttpAuth,
    HttpSnapshot,
    HttpPipeline,
    /// Prints a web config asking basic auth of `scraper` with --password, and exits.
    WebConfig,
}

#[derive(Parser, Debug)]
#[command(name = "gpumon-flood", version, about)]
struct Args {
    /// Which flood.
    #[arg(value_enum)]
    kind: Kind,
    /// The daemon's ingest socket.
    #[arg(long, env = "GPUMON_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The daemon's HTTP base URL.
    #[arg(long, default_value = "http://127.0.0.1:9477", value_name = "URL")]
    api: String,
    /// Sessions (crash, hello-close) or connections (partial) in the flood.
    #[arg(long, default_value_t = 100_000)]
    sessions: usize,
    /// Connections open at once (crash, hello-close).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Bytes of the unfinished line each partial connection holds.
    #[arg(long, default_value_t = 65_000)]
    bytes: usize,
    /// Seconds the partial connections hold their lines before closing.
    #[arg(long, default_value_t = 5)]
    hold: u64,
    /// Seconds watched after the flood, before the "after" figure is read.
    #[arg(long, default_value_t = 15)]
    settle: u64,
    /// Fail when the daemon's RSS ends more than this many MB above its start.
    #[arg(long, value_name = "MB")]
    max_after_mb: Option<f64>,
    /// Fail when its RSS peaks above this many MB.
    #[arg(long, value_name = "MB")]
    max_peak_mb: Option<f64>,
    /// Fail when the trainer's p99 round trip during the flood is longer.
    #[arg(long, value_name = "MS")]
    max_p99_ms: Option<f64>,
    /// Fail when the slowest /api/v1/snapshot taken during the flood took longer.
    #[arg(long, value_name = "MS")]
    max_snapshot_ms: Option<f64>,
    /// HTTP floods: flooding clients.
    #[arg(long, default_value_t = 512)]
    clients: usize,
    /// HTTP floods: seconds scraped during the flood.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// The password of user `scraper` (web-config; the scraper's, when the daemon asks it).
    #[arg(long)]
    password: Option<String>,
    /// HTTP floods: fail when fewer scrapes are answered, in percent.
    #[arg(long, value_name = "PERCENT")]
    min_answered: Option<f64>,
}

const MB: f64 = 1_000_000.0;

fn hello(job: &str, rank: usize) -> String {
    format!("{{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"{job}\",\"rank\":{rank}}}\n")
}

fn connect(socket: &Path) -> anyhow::Result<UnixStream> {
    let s = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot connect to {}; is the daemon running? (--socket)",
            socket.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

/// Says hello and waits for the welcome; false when the daemon said something else (refused).
fn greet(s: &UnixStream, job: &str, rank: usize) -> anyhow::Result<bool> {
    (&*s).write_all(hello(job, rank).as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    Ok(line.contains("\"welcome\""))
}

/// One session of a crash or hello-close flood.
fn one_session(socket: &Path, kind: Kind, rank: usize) -> anyhow::Result<bool> {
    let s = connect(socket)?;
    if !greet(&s, "flood", rank)? {
        return Ok(false);
    }
    if kind == Kind::Crash {
        (&s).write_all(
            b"{\"type\":\"sample\",\"ts\":1763700000,\"step\":1,\"stats\":{\"allocated_bytes.all.current\":1000}}\n",
        )?;
    }
    Ok(true)
}

/// The well-behaved trainer: a step every 10 ms, each followed by a bad line whose error reply
/// comes back after the step was handled, so its wait is the step's round trip.
fn trainer(socket: &Path, stop: &AtomicBool) -> anyhow::Result<Vec<Duration>> {
    let w = connect(socket)?;
    let mut r = BufReader::new(w.try_clone()?);
    if !greet(&w, "bystander", 0)? {
        bail!("the bystander trainer was refused its hello");
    }
    let mut rtt = Vec::new();
    let mut line = String::new();
    let mut step = 0u64;
    while !stop.load(Ordering::Relaxed) {
        step += 1;
        let sample = format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":1000}}}}\n{{oops\n",
            1_763_700_000 + step
        );
        let t = Instant::now();
        (&w).write_all(sample.as_bytes())?;
        line.clear();
        r.read_line(&mut line)?;
        rtt.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    (&w).write_all(b"{\"type\":\"bye\",\"ts\":1763800000}\n")?;
    Ok(rtt)
}

#[derive(Default)]
struct Watch {
    peak: AtomicU64,
    snapshots: AtomicUsize,
    biggest_snapshot: AtomicUsize,
    slowest_snapshot_us: AtomicU64,
    failed_snapshots: AtomicUsize,
}

fn rss(pid: u32) -> u64 {
    daemon::memory(pid).map(|m| m.0).unwrap_or(0)
}

fn percentile(v: &mut [Duration], p: usize) -> Duration {
    v.sort();
    v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// The address of an `http://HOST:PORT` base URL.
fn api_addr(api: &str) -> anyhow::Result<std::net::SocketAddr> {
    let hostport = api
        .strip_prefix("http://")
        .unwrap_or(api)
        .trim_end_matches('/');
    hostport
        .parse()
        .with_context(|| format!("--api {api}: give it as http://IP:PORT for an HTTP flood"))
}

fn run(args: &Args) -> anyhow::Result<bool> {
    let Some(socket) = args.socket.as_deref() else {
        bail!("give the daemon's ingest socket: --socket PATH (or GPUMON_SOCKET)");
    };
    let probe = connect(socket)?;
    let pid = daemon::peer_pid(&probe)?;
    drop(probe);
    let user_password = args.password.as_ref().map(|p| format!("scraper:{p}"));
    let mut api = daemon::Api::new(&args.api);
    if let Some(up) = &user_password {
        api = api.with_auth(flood_http::basic(up));
    }
    let scraper_auth = user_password
        .as_deref()
        .map(flood_http::auth_header)
        .unwrap_or_default();
    let mut http = None;
    api.counters()?;
    // What a normal run allocates once (a snapshot, a session) is in the start figure.
    one_session(socket, Kind::Crash, 0)?;
    api.get("/api/v1/snapshot")?;
    std::thread::sleep(Duration::from_millis(500));
    let start = rss(pid);
    let watch = Watch::default();
    watch.peak.store(start, Ordering::Relaxed);
    let stop = AtomicBool::new(false);
    let refused = AtomicUsize::new(0);
    let errors = AtomicUsize::new(0);
    let next = AtomicUsize::new(1);
    let t0 = Instant::now();
    let (mut rtt, flood_s, end_of_flood) = std::thread::scope(|sc| -> anyhow::Result<_> {
        let bystander = sc.spawn(|| trainer(socket, &stop));
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                match api.get("/api/v1/snapshot") {
                    Ok((200, body)) => {
                        watch.snapshots.fetch_add(1, Ordering::Relaxed);
                        watch
                            .biggest_snapshot
                            .fetch_max(body.len(), Ordering::Relaxed);
                        let us = t.elapsed().as_micros() as u64;
                        watch.slowest_snapshot_us.fetch_max(us, Ordering::Relaxed);
                    }
                    _ => {
                        watch.failed_snapshots.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                watch.peak.fetch_max(rss(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        match args.kind {
            Kind::Crash | Kind::HelloClose => {
                let next = &next;
                let workers: Vec<_> = (0..args.concurrency.max(1))
                    .map(|_| {
                        let (refused, errors) = (&refused, &errors);
                        sc.spawn(move || loop {
                            let rank = next.fetch_add(1, Ordering::Relaxed);
                            if rank > args.sessions {
                                break;
                            }
                            match one_session(socket, args.kind, rank) {
                                Ok(true) => {}
                                Ok(false) => {
                                    refused.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(_) => {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        })
                    })
                    .collect();
                for w in workers {
                    let _ = w.join();
                }
            }
            Kind::HttpAuth | Kind::HttpSnapshot | Kind::HttpPipeline => {
                let kind = match args.kind {
                    Kind::HttpAuth => flood_http::Http::Auth,
                    Kind::HttpSnapshot => flood_http::Http::Snapshot,
                    _ => flood_http::Http::Pipeline,
                };
                let addr = api_addr(&args.api)?;
                http = Some(flood_http::run(
                    kind,
                    addr,
                    args.clients,
                    args.seconds,
                    &scraper_auth,
                )?);
            }
            Kind::WebConfig => bail!("web-config prints a file; it floods nothing"),
            Kind::Partial => {
                let mut held = Vec::with_capacity(args.sessions);
                let line = format!(
                    "{{\"type\":\"sample\",\"ts\":1763700000,\"step\":1,\"pad\":\"{}",
                    "x".repeat(args.bytes.saturating_sub(60))
                );
                for rank in 1..=args.sessions {
                    let s = match connect(socket) {
                        Ok(s) => s,
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    match greet(&s, "flood", rank) {
                        Ok(true) => {}
                        _ => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    }
                    // Written from a thread of its own: a daemon that stops reading (its budget
                    // full) must not stall the flood.
                    let _ = s.set_nonblocking(true);
                    let _ = (&s).write(line.as_bytes());
                    held.push(s);
                }
                std::thread::sleep(Duration::from_secs(args.hold));
                drop(held);
            }
        }
        let flood_s = t0.elapsed().as_secs_f64();
        let end_of_flood = rss(pid);
        // The bystander and the scraper keep going through the settle time.
        std::thread::sleep(Duration::from_secs(args.settle));
        stop.store(true, Ordering::Relaxed);
        let rtt = match bystander.join() {
            Ok(r) => r?,
            Err(_) => bail!("the bystander trainer panicked"),
        };
        Ok((rtt, flood_s, end_of_flood))
    })?;
    let after = rss(pid);
    let peak = watch.peak.load(Ordering::Relaxed).max(after);
    let counters = api.counters()?;
    let n = if http.is_some() {
        args.clients
    } else {
        args.sessions
    };
    let kind = format!("{:?}", args.kind).to_lowercase();
    println!(
        "flood {kind}: {n} {} in {flood_s:.1} s ({:.0}/s), {} refused, {} failed; the daemon's ingest counters: {:.0} lines, {:.0} rejected",
        match args.kind {
            Kind::Partial => "connections",
            Kind::HttpAuth | Kind::HttpSnapshot | Kind::HttpPipeline => "clients",
            _ => "sessions",
        },
        n as f64 / flood_s.max(1e-9),
        refused.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        counters.lines,
        counters.rejected,
    );
    println!(
        "rss: start {:.1} MB, peak {:.1} MB, end of flood {:.1} MB, {} s later {:.1} MB ({:+.1} MB)",
        start as f64 / MB,
        peak as f64 / MB,
        end_of_flood as f64 / MB,
        args.settle,
        after as f64 / MB,
        (after as f64 - start as f64) / MB,
    );
    println!(
        "snapshots: {} taken, {} failed, largest {} KB, slowest {:.1} ms",
        watch.snapshots.load(Ordering::Relaxed),
        watch.failed_snapshots.load(Ordering::Relaxed),
        watch.biggest_snapshot.load(Ordering::Relaxed) / 1000,
        watch.slowest_snapshot_us.load(Ordering::Relaxed) as f64 / 1000.0,
    );
    let steps = rtt.len();
    let p50 = percentile(&mut rtt, 50);
    let p99 = percentile(&mut rtt, 99);
    println!(
        "bystander trainer: {steps} steps, round trip p50 {:.2} ms, p99 {:.2} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    let mut answered_pct = None;
    if let Some(h) = &mut http {
        let pct = 100.0 * h.answered as f64 / h.scrapes.max(1) as f64;
        answered_pct = Some(pct);
        let n = h.latencies.len();
        let (p50, p99) = (
            percentile(&mut h.latencies, 50),
            percentile(&mut h.latencies, 99),
        );
        println!(
            "scraper (a new connection per scrape of /metrics, once a second): {} of {} answered ({pct:.0}%), p50 {:.1} ms, p99 {:.1} ms over {n}; the flood sent {} requests",
            h.answered,
            h.scrapes,
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            h.flood_requests
        );
    }
    let mut ok = true;
    if let (Some(pct), Some(min)) = (answered_pct, args.min_answered) {
        let pass = pct >= min;
        ok &= pass;
        println!(
            "{}: scrapes answered {pct:.0}% (at least {min})",
            if pass { "PASS" } else { "FAIL" }
        );
    }
    let mut check = |what: &str, got: f64, max: Option<f64>| {
        if let Some(max) = max {
            let pass = got <= max;
            ok &= pass;
            println!(
                "{}: {what} {got:.1} (at most {max})",
                if pass { "PASS" } else { "FAIL" }
            );
        }
    };
    check(
        "MB above the start after the flood",
        (after as f64 - start as f64) / MB,
        args.max_after_mb,
    );
    check("peak MB", peak as f64 / MB, args.max_peak_mb);
    check("bystander p99 ms", p99.as_secs_f64() * 1e3, args.max_p99_ms);
    check(
        "slowest snapshot ms",
        watch.slowest_snapshot_us.load(Ordering::Relaxed) as f64 / 1000.0,
        args.max_snapshot_ms,
    );
    Ok(ok)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.kind == Kind::WebConfig {
        let Some(p) = &args.password else {
            eprintln!("gpumon-flood: web-config needs --password");
            return std::process::ExitCode::from(2);
        };
        return match flood_http::web_config("scraper", p) {
            Ok(text) => {
                print!("{text}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("gpumon-flood: {e:#}");
                std::process::ExitCode::from(2)
            }
        };
    }
    match run(&args) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("gpumon-flood: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
