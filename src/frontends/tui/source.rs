//! Where the TUI's data comes from: one thread per daemon polling its JSON API (with capped
//! backoff while it is away), or, with no daemon, one thread reading NVML in-process. Each sends
//! `Msg::Data` to the event loop; none of them touches the state.

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

/// One snapshot: with `since` (the last answer's cursor) only the history after it; an empty
/// `since` asks for a first cursor, which a daemon without them ignores.
fn fetch(
    client: &DaemonClient,
    base: &str,
    history: f64,
    since: Option<&str>,
) -> Result<Snapshot, String> {
    let url = format!(
        "{base}/api/v1/snapshot?history={}&since={}",
        history.ceil() as u64,
        since.unwrap_or("")
    );
    let mut resp = client.get(&url).map_err(|e| format!("{base}: {e}"))?;
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_vec()
        .map_err(|e| format!("{base}: {e}"))?;
    // Every string escaped by the one rule as it is parsed, once per poll: ratatui would drop
    // an escape's control character and draw the rest of it, and draw the invisible ones.
    serde_json::from_slice(&crate::util::printable::json_strings(&body))
        .map_err(|e| format!("{base} answered, but not with a gpumon snapshot: {e}"))
}

/// One quick attempt, to decide at start-up between the local daemon and in-process NVML.
pub fn probe(base: &str, client: &DaemonClient) -> Result<Snapshot, String> {
    fetch(client, base, HISTORY_SECS, None)
}

/// The cursor to send back: the daemon's, when it goes into a URL as it is (the daemon writes
/// base 36 and `._-`; anything else starts over with a whole snapshot).
pub fn next_cursor(snap: &Snapshot) -> Option<String> {
    snap.cursor.clone().filter(|c| {
        c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    })
}

/// Polls `base` every `refresh` until the event loop goes away, from `cursor` (the probe's).
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
            let (update, wait) = match fetch(&agent, &base, history, cursor.as_deref()) {
                Ok(s) => {
                    let received = now();
                    cursor = next_cursor(&s);
                    last_ok = Some(started);
                    attempt = 0;
                    backoff.reset();
                    let wait = refresh.saturating_sub(started.elapsed());
                    let update = Update::Answer {
                        snap: Box::new(s),
                        sent,
                        received,
                    };
                    (update, wait)
                }
                Err(error) => {
                    attempt += 1;
                    let wait = backoff.fail();
                    let update = Update::Down {
                        error,
                        ts: now(),
                        retry_in_s: wait.as_secs(),
                        attempt,
                    };
                    (update, wait)
                }
            };
            if tx.send(Msg::Data(node, update)).is_err() {
                return;
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
