//! Where the TUI's data comes from: one thread per daemon polling its JSON API (with capped
//! backoff while it is away), or, with no daemon, one thread reading NVML in-process. Each sends
//! `Msg::Data` to the event loop; none of them touches the state.

use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use crate::core::model::now;
use crate::core::snapshot::Snapshot;
use crate::daemon_client::DaemonClient;
use crate::frontends::local::LocalNode;
use crate::frontends::tui::app::state::{Update, HISTORY_SECS};
use crate::frontends::tui::Msg;
use crate::util::backoff::Backoff;

/// Longest wait between attempts to reach a daemon that went away.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

pub use crate::daemon_client::normalize_url;

/// The largest answer the TUI reads: one over it is refused by name, not read.
pub const MAX_ANSWER: u64 = 64 << 20;

/// The most of a core a daemon's polling may take, the apply and the drawing of its answers
/// included: when a refresh costs more (a daemon of 20,000 sessions answers 56 MiB), the next
/// one waits until the cost is that share of the time since the last.
const CPU_SHARE: f64 = 0.25;

/// The longest a costly refresh delays the next.
const MAX_PACE: Duration = Duration::from_secs(30);

/// What a poll brought.
enum Fetched {
    /// A snapshot, and the answer's `ETag` (sent back as `If-None-Match`).
    Snapshot(Box<Snapshot>, Option<String>),
    /// `304 Not Modified`: the same answer as the last, so nothing is read or applied.
    Unchanged,
}

/// One snapshot: with `since` (the last answer's cursor) only the history after it; an empty
/// `since` asks for a first cursor, which a daemon without them ignores. With `etag` (the last
/// answer's), a server that answers the same again (a static snapshot, a cache) says so.
fn fetch(
    client: &DaemonClient,
    base: &str,
    history: f64,
    since: Option<&str>,
    etag: Option<&str>,
) -> Result<Fetched, String> {
    let url = format!(
        "{base}/api/v1/snapshot?history={}&since={}",
        history.ceil() as u64,
        since.unwrap_or("")
    );
    let headers: Vec<(&str, &str)> = etag.map(|e| ("If-None-Match", e)).into_iter().collect();
    let mut resp = client
        .get_with(&url, &headers)
        .map_err(|e| format!("{base}: {e}"))?;
    if resp.status() == ureq::http::StatusCode::NOT_MODIFIED {
        return Ok(Fetched::Unchanged);
    }
    let etag = resp
        .headers()
        .get(ureq::http::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .filter(|e| e.len() <= 256 && e.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string);
    let too_big = |n: &str| {
        format!(
            "{base} answered a snapshot of {n} bytes, over the {} MiB the TUI reads; a node that large is better watched through its /metrics",
            MAX_ANSWER >> 20
        )
    };
    let declared = resp.body().content_length();
    if let Some(n) = declared.filter(|n| *n > MAX_ANSWER) {
        return Err(too_big(&n.to_string()));
    }
    // Sized once from the declared length (a 56 MiB body grown by doubling was copied whole
    // several times over), read no further than the cap whatever the server sends.
    let mut body = Vec::with_capacity(declared.unwrap_or(0) as usize);
    resp.body_mut()
        .as_reader()
        .take(MAX_ANSWER + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("{base}: {e}"))?;
    if body.len() as u64 > MAX_ANSWER {
        return Err(too_big(&format!("more than {MAX_ANSWER}")));
    }
    // Every string escaped by the one rule as it is parsed, once per poll: ratatui would drop
    // an escape's control character and draw the rest of it, and draw the invisible ones.
    let snap = serde_json::from_slice(&crate::util::printable::json_strings(&body))
        .map_err(|e| format!("{base} answered, but not with a gpumon snapshot: {e}"))?;
    Ok(Fetched::Snapshot(Box::new(snap), etag))
}

/// One quick attempt, to decide at start-up between the local daemon and in-process NVML.
pub fn probe(base: &str, client: &DaemonClient) -> Result<Snapshot, String> {
    match fetch(client, base, HISTORY_SECS, None, None)? {
        Fetched::Snapshot(s, _) => Ok(*s),
        // Asked without an ETag: a server that answers 304 to that is no daemon.
        Fetched::Unchanged => Err(format!(
            "{base} answered 304 Not Modified to a first request"
        )),
    }
}

/// The cursor to send back: the daemon's, when it goes into a URL as it is (the daemon writes
/// base 36 and `._-`; anything else starts over with a whole snapshot).
pub fn next_cursor(snap: &Snapshot) -> Option<String> {
    snap.cursor.clone().filter(|c| {
        c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    })
}

/// CPU seconds this process has used, all threads (from /proc/self/stat: its `utime` and
/// `stime`, in the kernel's USER_HZ, 100 a second on Linux whatever the kernel's own tick).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name, which may hold spaces, in parentheses.
    let mut fields = stat
        .get(stat.rfind(')')? + 2..)?
        .split_whitespace()
        .skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// How long a refresh that started `elapsed` ago waits before the next: `refresh` after its
/// start, or longer when the `cost` (CPU seconds the process spent since the last refresh: the
/// fetch, the apply and the drawing) would take more than `CPU_SHARE` of a core.
fn pace(refresh: Duration, elapsed: Duration, cost: f64) -> Duration {
    let cycle = Duration::try_from_secs_f64(cost / CPU_SHARE)
        .unwrap_or(MAX_PACE)
        .min(MAX_PACE)
        .max(refresh);
    cycle.saturating_sub(elapsed)
}

/// Polls `base` every `refresh` until the event loop goes away, from `cursor` (the probe's).
/// Every TUI's process CPU counts against each node's share: with several nodes, each polls
/// slower than it would alone once answers are costly, never faster.
pub fn spawn_daemon(
    node: usize,
    base: String,
    refresh: Duration,
    client: DaemonClient,
    tx: Sender<Msg>,
    mut cursor: Option<String>,
) {
    let name = format!("gpumon-tui-fetch-{node}");
    let _ = std::thread::Builder::new().name(name).spawn(move || {
        let agent = client;
        let mut last_ok: Option<Instant> = None;
        let mut backoff = Backoff::new(Duration::from_secs(1), MAX_BACKOFF);
        let mut attempt = 0;
        let mut etag: Option<String> = None;
        let mut cpu = cpu_seconds();
        loop {
            // The history after the last answer: what its cursor held, or without one (a
            // daemon before cursors) the seconds since (all of it the first time). The cursor
            // stays while the daemon is away: a restarted one does not honour it and answers
            // whole.
            let history = match (&cursor, last_ok) {
                (None, Some(t)) => (t.elapsed().as_secs_f64() + 2.0).min(HISTORY_SECS),
                _ => HISTORY_SECS,
            };
            let started = Instant::now();
            let sent = now();
            let fetched = fetch(&agent, &base, history, cursor.as_deref(), etag.as_deref());
            let (update, wait) = match fetched {
                Ok(fetched) => {
                    let received = now();
                    last_ok = Some(started);
                    attempt = 0;
                    backoff.reset();
                    let update = match fetched {
                        Fetched::Snapshot(s, tag) => {
                            cursor = next_cursor(&s);
                            etag = tag;
                            Some(Update::Answer {
                                snap: s,
                                sent,
                                received,
                            })
                        }
                        Fetched::Unchanged => None,
                    };
                    // What the last refresh cost, its answer's apply and drawing included.
                    let now_cpu = cpu_seconds();
                    let cost = match (cpu, now_cpu) {
                        (Some(a), Some(b)) => b - a,
                        _ => 0.0,
                    };
                    cpu = now_cpu;
                    (update, pace(refresh, started.elapsed(), cost))
                }
                Err(error) => {
                    attempt += 1;
                    etag = None;
                    let wait = backoff.fail();
                    let update = Update::Down {
                        error,
                        ts: now(),
                        retry_in_s: wait.as_secs(),
                        attempt,
                    };
                    (Some(update), wait)
                }
            };
            if let Some(update) = update {
                if tx.send(Msg::Data(node, update)).is_err() {
                    return;
                }
            }
            std::thread::sleep(wait);
        }
    });
}

/// Reads NVML in this process every `refresh`, through the daemon's own poller and aggregator
/// (`LocalNode`): the TUI works before the daemon is installed.
pub fn spawn_in_process(
    node: usize,
    nvml_lib: String,
    procfs: PathBuf,
    refresh: Duration,
    tx: Sender<Msg>,
) {
    let _ = std::thread::Builder::new()
        .name("gpumon-tui-local".into())
        .spawn(move || {
            let local = match LocalNode::start(nvml_lib, procfs, refresh, 1) {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Msg::Data(
                        node,
                        Update::Down {
                            error: format!("cannot start reading NVML in-process: {e}"),
                            ts: now(),
                            retry_in_s: 0,
                            attempt: 1,
                        },
                    ));
                    return;
                }
            };
            let mut seen = 0;
            loop {
                // Waits out the poller's backoff while NVML is failing; checks the event loop
                // is still there at least every `refresh`.
                let update = local.next_snapshot(seen, refresh.max(Duration::from_millis(100)));
                let Some((collection, snap)) = update else {
                    continue;
                };
                seen = collection;
                if tx
                    .send(Msg::Data(node, Update::Snapshot(Box::new(snap))))
                    .is_err()
                {
                    return;
                }
            }
        });
}

#[cfg(test)]
mod tests;
