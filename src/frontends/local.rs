//! NVML read in this process through the daemon's own parts (the poller feeding an aggregator):
//! what `gpumon status --direct` and the TUI's in-process mode read when no daemon runs, so
//! they show exactly what a daemon would, computed the same way.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::aggregator::{self, Handle};
use crate::core::query::{Answer, Query};
use crate::core::snapshot::Snapshot;
use crate::core::store::{HistoryLimits, Store};
use crate::sources::nvml::NvmlSource;

/// This machine as the config names it: where its daemon listens, and how to read NVML here when
/// none answers. `gpumon status` and the TUI take this, not the config, which sits above them.
#[derive(Debug, Clone)]
pub struct Machine {
    pub listen: SocketAddr,
    pub nvml_lib: String,
    pub procfs: PathBuf,
    /// NVML's poll interval.
    pub interval: Duration,
}

pub struct LocalNode {
    handle: Option<Handle>,
    stop: Option<Sender<()>>,
    threads: Vec<JoinHandle<()>>,
    hostname: String,
}

impl LocalNode {
    /// Starts polling `nvml_lib` every `interval`, keeping `points` of history.
    pub fn start(
        nvml_lib: String,
        procfs: PathBuf,
        interval: Duration,
        points: usize,
    ) -> std::io::Result<Self> {
        let limits = HistoryLimits {
            gpu_points: points.max(1),
        };
        let store = Store::new(limits, interval.as_secs_f64(), nvml_lib.clone());
        // Its readers take snapshots, never /metrics: the Prometheus text is not encoded (at 8
        // GPUs x 128 processes that was a sixth of `gpumon status --direct`'s work).
        let (handle, agg) = aggregator::spawn(store, |_| String::new(), None)?;
        let (stop, stop_rx) = std::sync::mpsc::channel();
        let source = Box::new(NvmlSource::new(nvml_lib, procfs));
        let poll = handle.clone();
        let poller = std::thread::Builder::new()
            .name("gpumon-nvml".into())
            .spawn(move || {
                // Its readers say what NVML's state is in their own words (`gpumon status`'s
                // message, the TUI's header): the daemon's log lines ("serving gpumon_nvml_up 0
                // and retrying") would only be noise before them, or break the TUI's screen.
                let quiet = tracing::subscriber::NoSubscriber::default();
                tracing::subscriber::with_default(quiet, || {
                    crate::sources::poller::run(
                        source,
                        poll,
                        |_, _| String::new(),
                        interval,
                        stop_rx,
                    )
                })
            })?;
        Ok(Self {
            handle: Some(handle),
            stop: Some(stop),
            threads: vec![poller, agg],
            hostname: crate::core::snapshot::hostname(),
        })
    }

    /// The snapshot after the first collection newer than `after` (0: any), with that
    /// collection's number; None when none came within `timeout`.
    pub fn next_snapshot(&self, after: u64, timeout: Duration) -> Option<(u64, Snapshot)> {
        let handle = self.handle.as_ref()?;
        let deadline = Instant::now() + timeout;
        // The view is published at once after a collection: a short poll of it is enough (an
        // Arc clone a millisecond; `gpumon status` waits on it once).
        while handle.view().collection <= after {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let asked = Query::Local {
            hostname: self.hostname.clone(),
        };
        match handle.query_blocking(asked)? {
            Answer::Local(generation, snap) => Some((generation, *snap)),
            _ => None,
        }
    }
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        // The poller ends on the stop signal and the aggregator once no handle is left.
        self.stop.take();
        self.handle.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
