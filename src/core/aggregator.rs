//! The one owner of the daemon's state (the tokio-console shape). The poller and every ingest
//! connection send their inputs on one bounded channel; a dedicated thread applies them to the
//! store in arrival order, runs detection as part of that, and after each batch of inputs
//! publishes an immutable `Arc<View>` on a watch channel. Every input is typed and applied by
//! `Core::apply`; nothing else touches the store: readers take the latest view, and reads that
//! need history (the JSON API) are typed queries answered on this thread between inputs. So
//! there is no lock to contend for, poison, or hold across a slow step.
//!
//! Every bounded hand-off counts what it could not take: a collection offered while the queue
//! is full is dropped (the next one comes a poll later), finding transitions the alert thread
//! cannot take are dropped, and an ingest batch that finds the queue full waits for room (its
//! trainer's socket buffer then fills and the client counts what it drops) and that wait is
//! counted. Each count is exported.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::view::View;
use crate::core::apply::Core;
use crate::core::detect::Finding;
use crate::core::input::{Input, Output};
use crate::core::query::{Answer, Query};
use crate::core::store::Store;

mod handle;
mod health;

pub use handle::{Handle, WeakHandle};

/// Inputs waiting for the aggregator at most: a few hundred milliseconds of the heaviest load
/// measured (64 trainers), and a bound on what a stalled aggregator holds.
pub const QUEUE: usize = 1024;
/// Finding transitions waiting for the alert thread at most.
pub const ALERT_QUEUE: usize = 4096;
/// Shortest gap between two published views while inputs keep coming: readers see each change
/// within this. (The trainer text is encoded only when a scrape syncs, never per publish.)
const PUBLISH_GAP: Duration = Duration::from_millis(10);
/// Inputs applied between two looks at the clock.
const DRAIN: usize = 256;
/// After draining a queue that held trainers' inputs, how long the aggregator waits before it
/// looks again (after only collections and queries it does not wait). Inputs that
/// arrive meanwhile are queued without waking it, and the trainers whose batches wait read more
/// lines per batch: at 64 busy trainers this halves the daemon's CPU (thread wake-ups were most
/// of it) for at most this much added latency. Interrupt coalescing, in effect.
const LINGER: Duration = Duration::from_millis(1);

/// What the aggregator takes; see `Handle` for who sends which.
enum Msg {
    /// An input for the core, and where its output goes (a collection's goes nowhere).
    Apply(Input, Option<oneshot::Sender<Output>>),
    Query(Query, oneshot::Sender<Answer>),
    /// Publish what was applied, if anything waits, and say so.
    Sync(oneshot::Sender<()>),
    /// Apply what is queued, then end (later sends fail).
    Stop,
    /// Tests: hold the thread until the sender goes, or panic inside an apply.
    #[cfg(test)]
    Test(tests::Probe),
}

/// Labels of `AggregatorStats::updates`, in order: a batch of a trainer connection's lines, a
/// connection ending, and anything else (a replayed trace note; a running daemon gets none).
pub const UPDATES: [&str; 3] = ["ingest", "close", "other"];

/// Where an input is counted in `AggregatorStats::updates` (a collection has its own count).
fn update_index(input: &Input) -> Option<usize> {
    match input {
        Input::Collection(_) => None,
        Input::Lines(_) => Some(0),
        Input::Close(_) => Some(1),
        Input::Note(..) => Some(2),
    }
}

/// The aggregator's own health (gpumon_aggregator_*).
#[derive(Debug, Default)]
pub struct AggregatorStats {
    pub collections: AtomicU64,
    /// Collections dropped because the queue was full.
    pub collections_dropped: AtomicU64,
    /// Inputs other than collections applied, by kind (in `UPDATES` order).
    pub updates: [AtomicU64; 3],
    pub reads: AtomicU64,
    /// Sends that found the queue full and waited for room.
    pub queue_full: AtomicU64,
    /// Inputs and queries that panicked; the aggregator went on with the next one.
    pub panics: AtomicU64,
    pub views: AtomicU64,
    /// Time spent applying inputs and publishing views, in nanoseconds.
    pub busy_ns: AtomicU64,
    /// Finding transitions dropped because the alert thread's queue was full.
    pub alerts_dropped: AtomicU64,
    /// Finding transitions one input raised past the findings' outbox (4,096) before they
    /// could be forwarded.
    pub outbox_dropped: AtomicU64,
}

/// Encodes the trainer and finding families of a store (given by the daemon, so the core does
/// not depend on the exposition format).
pub type Encode = fn(&Store) -> String;

/// Starts the aggregator thread, owning `store`. Finding transitions go to `alerts` when given,
/// and are dropped otherwise (no sink wants them). The thread ends when every `Handle` is gone,
/// after applying what was sent.
pub fn spawn(
    store: Store,
    encode: Encode,
    alerts: Option<std::sync::mpsc::SyncSender<Finding>>,
) -> std::io::Result<(Handle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let mut agg = Aggregator {
        core: Core::new(store),
        encode,
        alerts,
        stats: Arc::new(AggregatorStats::default()),
        view: Arc::new(View::default()),
        trainers_dirty: true,
        last_encode: None,
    };
    let first = agg.next_view(true);
    let (view_tx, view_rx) = watch::channel(first.clone());
    agg.view = first;
    let handle = Handle::new(tx, view_rx, agg.stats.clone());
    let thread = std::thread::Builder::new()
        .name("gpumon-aggregator".into())
        .spawn(move || agg.run(rx, view_tx))?;
    Ok((handle, thread))
}

struct Aggregator {
    core: Core,
    encode: Encode,
    alerts: Option<std::sync::mpsc::SyncSender<Finding>>,
    stats: Arc<AggregatorStats>,
    view: Arc<View>,
    /// Sessions or findings changed since the trainer text was encoded.
    trainers_dirty: bool,
    last_encode: Option<Instant>,
}

impl Aggregator {
    fn run(mut self, rx: mpsc::Receiver<Msg>, views: watch::Sender<Arc<View>>) {
        // A current-thread runtime only to wait on the channel with a deadline; every input is
        // applied synchronously on this thread.
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "the aggregator could not start; no input will be applied");
                return;
            }
        };
        rt.block_on(self.serve(rx, views));
    }

    async fn serve(&mut self, mut rx: mpsc::Receiver<Msg>, views: watch::Sender<Arc<View>>) {
        let stop = |rx: &mut mpsc::Receiver<Msg>| {
            // recv() now returns what is queued, then None.
            rx.close();
        };
        let mut last_publish = Instant::now();
        let mut unpublished = false;
        // Syncs waiting for the next encode: scrapes faster than PUBLISH_GAP share one.
        let mut held: Vec<oneshot::Sender<()>> = Vec::new();
        loop {
            let first = if unpublished {
                let left = PUBLISH_GAP.saturating_sub(last_publish.elapsed());
                match tokio::time::timeout(left, rx.recv()).await {
                    Ok(Some(i)) => Some(i),
                    Ok(None) => {
                        self.publish(&views, false);
                        return;
                    }
                    Err(_) => None,
                }
            } else {
                match rx.recv().await {
                    Some(i) => Some(i),
                    None => return,
                }
            };
            let started = Instant::now();
            let mut urgent = false;
            let mut next = first;
            let mut applied = 0;
            // Whether trainers' lines were applied: only they gain from the linger below.
            let mut ingested = false;
            while let Some(input) = next.take() {
                if matches!(input, Msg::Stop) {
                    stop(&mut rx);
                } else if let Msg::Sync(done) = input {
                    // A scrape is about to read the view: what is applied goes out first, so
                    // a scrape after an API read never shows less than that read did. At most
                    // one encode per PUBLISH_GAP, however fast /metrics is asked for.
                    if !(unpublished || self.trainers_dirty) {
                        let _ = done.send(());
                    } else if self.encode_due() {
                        self.publish(&views, true);
                        last_publish = Instant::now();
                        unpublished = false;
                        let _ = done.send(());
                    } else {
                        held.push(done);
                        // So the loop wakes when the gap is over.
                        unpublished = true;
                    }
                } else {
                    ingested |=
                        matches!(&input, Msg::Apply(i, _) if !matches!(i, Input::Collection(_)));
                    let (changed, collection) = self.apply(input);
                    unpublished |= changed;
                    urgent |= collection;
                }
                applied += 1;
                if applied == DRAIN {
                    break;
                }
                next = rx.try_recv().ok();
            }
            if !held.is_empty() && self.encode_due() {
                self.publish(&views, true);
                last_publish = Instant::now();
                unpublished = false;
                for done in held.drain(..) {
                    let _ = done.send(());
                }
            } else if unpublished && (urgent || last_publish.elapsed() >= PUBLISH_GAP) {
                self.publish(&views, false);
                last_publish = Instant::now();
                // Held syncs still need the loop to wake for their encode.
                unpublished = !held.is_empty();
            }
            self.stats
                .busy_ns
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            // A batch of only collections and queries goes back to waiting at once: a reader
            // woken by the view it just published asks next (the one-shot status waited out
            // the linger for its answer, about 2 ms with the timer's rounding).
            if ingested && applied < DRAIN {
                tokio::time::sleep(LINGER).await;
            }
        }
    }

    /// Applies one input or answers one query; (whether the store changed, whether it was a
    /// collection). A panic is caught and counted: the panic message went to the log through
    /// the panic hook, the input is lost, and its sender sees its answer missing (an ingest
    /// connection closes).
    fn apply(&mut self, msg: Msg) -> (bool, bool) {
        let core = &mut self.core;
        let (ran, changed, collection) = match msg {
            Msg::Apply(input, reply) => {
                let collection = matches!(input, Input::Collection(_));
                match update_index(&input) {
                    Some(i) => self.stats.updates[i].fetch_add(1, Ordering::Relaxed),
                    None => self.stats.collections.fetch_add(1, Ordering::Relaxed),
                };
                let ran = catch_unwind(AssertUnwindSafe(|| core.apply(input))).map(|out| {
                    // The sender may have gone (a connection cancelled): nothing to tell it.
                    if let Some(reply) = reply {
                        let _ = reply.send(out);
                    }
                });
                (ran, true, collection)
            }
            Msg::Query(q, reply) => {
                self.stats.reads.fetch_add(1, Ordering::Relaxed);
                let ran = catch_unwind(AssertUnwindSafe(|| core.answer(q))).map(|a| {
                    // A closed HTTP request: nothing to tell it.
                    let _ = reply.send(a);
                });
                (ran, false, false)
            }
            #[cfg(test)]
            Msg::Test(probe) => {
                self.stats.updates[2].fetch_add(1, Ordering::Relaxed);
                (catch_unwind(AssertUnwindSafe(|| probe.run())), true, false)
            }
            Msg::Stop | Msg::Sync(_) => return (false, false),
        };
        if ran.is_err() {
            self.stats.panics.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                "an input panicked in the aggregator; it was dropped and the aggregator goes on"
            );
        }
        if changed {
            self.trainers_dirty = true;
            self.forward_transitions();
        }
        (changed, collection)
    }

    /// Hands finding transitions to the alert thread, each with its GPU's index resolved.
    fn forward_transitions(&mut self) {
        let transitions = self.core.transitions();
        self.stats
            .outbox_dropped
            .store(self.core.outbox_dropped(), Ordering::Relaxed);
        let Some(alerts) = &self.alerts else {
            return;
        };
        for f in transitions {
            if alerts.try_send(f).is_err() {
                self.stats.alerts_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Publishes a view. Without `encode` the trainer text is the last one encoded: only
    /// scrapes read it, and they sync first, which encodes it (64 busy trainers would otherwise
    /// cost 100 encodes a second).
    fn publish(&mut self, views: &watch::Sender<Arc<View>>, encode: bool) {
        let next = self.next_view(encode);
        self.view = next.clone();
        self.stats.views.fetch_add(1, Ordering::Relaxed);
        // No receiver left is not an error: the daemon is stopping.
        let _ = views.send(next);
    }

    /// Whether the trainer text may be encoded again (PUBLISH_GAP since the last encode).
    fn encode_due(&self) -> bool {
        self.last_encode.is_none_or(|t| t.elapsed() >= PUBLISH_GAP)
    }

    fn next_view(&mut self, encode: bool) -> Arc<View> {
        let s = self.core.store();
        let trainer_text = if encode && self.trainers_dirty {
            self.last_encode = Some(Instant::now());
            self.trainers_dirty = false;
            Arc::from((self.encode)(s))
        } else {
            self.view.trainer_text.clone()
        };
        Arc::new(View::of(
            s,
            s.gpu_text().clone(),
            trainer_text,
            self.view.seq + 1,
        ))
    }
}

#[cfg(test)]
mod tests;
