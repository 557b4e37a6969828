//! NVML read in this process through the daemon's own parts (the poller feeding an aggregator):
//! what `gpumon status --direct` and the TUI's in-process mode read when no daemon runs, so
//! they show exactly what a daemon would, computed the same way.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
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
    poller: Option<JoinHandle<()>>,
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
        // Its thread is not joined (see `drop`).
        let (handle, _) = aggregator::spawn(store, |_| String::new(), None)?;
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
            poller: Some(poller),
            hostname: crate::core::snapshot::hostname(),
        })
    }

    /// The snapshot after the first collection newer than `after` (0: any), with that
    /// collection's number; None when none came within `timeout`.
    pub fn next_snapshot(&self, after: u64, timeout: Duration) -> Option<(u64, Snapshot)> {
        let handle = self.handle.as_ref()?;
        let deadline = Instant::now() + timeout;
        // The view is published at once after a collection: woken by it, not by a poll of it
        // (a millisecond's poll cost `gpumon status` half of one on average).
        let mut views = handle.subscribe();
        let newer = views.wait_for(|v| v.collection > after);
        if !matches!(block_on(newer, deadline), Some(Ok(_))) {
            return None;
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

/// Runs `fut` to its end on this thread, parked between polls; None at `deadline`. The
/// aggregator's runtime lives on its own thread, and tokio's channels need none to wait on.
fn block_on<F: Future>(fut: F, deadline: Instant) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        // The poller ends on the stop signal (it is waited for: it shuts NVML down). The
        // aggregator ends once no handle is left, at its next wake, which can be a couple of
        // ms away (it lingers after each batch of inputs): it is not waited for, as it holds
        // nothing to flush or close (`gpumon status` waited that long before printing).
        self.stop.take();
        self.handle.take();
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
    }
}
