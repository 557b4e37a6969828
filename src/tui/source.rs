//! Where the TUI's data comes from: one thread per daemon polling its JSON API (with capped
//! backoff while it is away), or, with no daemon, one thread reading NVML in-process. Each sends
//! `Msg::Data` to the event loop; none of them touches the state.

use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use crate::daemon_client::DaemonClient;
use crate::model::now;
use crate::snapshot::Snapshot;
use crate::sources::nvml::NvmlSource;
use crate::sources::GpuSource;
use crate::store::{HistoryLimits, Store};
use crate::tui::app::state::{Update, HISTORY_SECS};
use crate::tui::Msg;

/// Longest wait between attempts to reach a daemon that went away.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

pub use crate::daemon_client::normalize_url;

fn fetch(client: &DaemonClient, base: &str, history: f64) -> Result<Snapshot, String> {
    let url = format!("{base}/api/v1/snapshot?history={}", history.ceil() as u64);
    let mut resp = client.get(&url).map_err(|e| format!("{base}: {e}"))?;
    resp.body_mut()
        .with_config()
        .limit(64 << 20)
        .read_json::<Snapshot>()
        .map_err(|e| format!("{base} answered, but not with a gpumon snapshot: {e}"))
}

/// One quick attempt, to decide at start-up between the local daemon and in-process NVML.
pub fn probe(base: &str, client: &DaemonClient) -> Result<Snapshot, String> {
    fetch(client, base, HISTORY_SECS)
}

/// Polls `base` every `refresh` until the event loop goes away.
pub fn spawn_daemon(
    node: usize,
    base: String,
    refresh: Duration,
    client: DaemonClient,
    tx: Sender<Msg>,
) {
    let name = format!("gpumon-tui-fetch-{node}");
    let _ = std::thread::Builder::new().name(name).spawn(move || {
        let agent = client;
        let mut last_ok: Option<Instant> = None;
        let mut backoff = Duration::from_secs(1);
        let mut attempt = 0;
        loop {
            // Ask for the history missed since the last answer (all of it the first time).
            let history = last_ok.map_or(HISTORY_SECS, |t| {
                (t.elapsed().as_secs_f64() + 2.0).min(HISTORY_SECS)
            });
            let started = Instant::now();
            let (update, wait) = match fetch(&agent, &base, history) {
                Ok(s) => {
                    last_ok = Some(started);
                    attempt = 0;
                    backoff = Duration::from_secs(1);
                    let wait = refresh.saturating_sub(started.elapsed());
                    (Update::Snapshot(Box::new(s)), wait)
                }
                Err(error) => {
                    attempt += 1;
                    let wait = backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
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

/// Reads NVML in this process every `refresh`: the TUI works before the daemon is installed.
pub fn spawn_in_process(
    node: usize,
    nvml_lib: String,
    procfs: PathBuf,
    refresh: Duration,
    tx: Sender<Msg>,
) {
    let _ = std::thread::Builder::new()
        .name("gpumon-tui-nvml".into())
        .spawn(move || {
            let mut source = NvmlSource::new(nvml_lib.clone(), procfs);
            let limits = HistoryLimits {
                gpu_points: 1,
                process_points: 1,
            };
            let mut store = Store::new(limits, refresh.as_secs_f64(), nvml_lib);
            let host = crate::snapshot::hostname();
            let mut backoff = refresh;
            loop {
                let started = Instant::now();
                let result = source.collect();
                let took = started.elapsed().as_secs_f64();
                let wait = match result {
                    Ok(r) => {
                        store.apply(r, took);
                        backoff = refresh;
                        refresh.saturating_sub(started.elapsed())
                    }
                    Err(e) => {
                        store.apply_failure(now(), e.to_string(), took);
                        let wait = backoff;
                        backoff = (backoff * 2).min(crate::poller::MAX_BACKOFF);
                        wait
                    }
                };
                let snap = Snapshot::build(&store, &host, 0.0);
                if tx
                    .send(Msg::Data(node, Update::Snapshot(Box::new(snap))))
                    .is_err()
                {
                    return;
                }
                std::thread::sleep(wait);
            }
        });
}
