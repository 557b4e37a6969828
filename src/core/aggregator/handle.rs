//! The senders' and readers' side of the aggregator: typed inputs in, typed answers back, the
//! latest view without waiting.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::{AggregatorStats, Msg};
use crate::core::input::{Input, Output};
use crate::core::query::{Answer, Query};
use crate::core::store::Collection;
use crate::core::view::View;

/// Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Msg>,
    view: watch::Receiver<Arc<View>>,
    stats: Arc<AggregatorStats>,
}

/// A handle that does not keep the aggregator running (for threads that must see it end).
#[derive(Clone)]
pub struct WeakHandle {
    tx: mpsc::WeakSender<Msg>,
    view: watch::Receiver<Arc<View>>,
    stats: Arc<AggregatorStats>,
}

impl WeakHandle {
    pub fn upgrade(&self) -> Option<Handle> {
        Some(Handle {
            tx: self.tx.upgrade()?,
            view: self.view.clone(),
            stats: self.stats.clone(),
        })
    }
}

impl Handle {
    pub(super) fn new(
        tx: mpsc::Sender<Msg>,
        view: watch::Receiver<Arc<View>>,
        stats: Arc<AggregatorStats>,
    ) -> Self {
        Self { tx, view, stats }
    }

    pub fn downgrade(&self) -> WeakHandle {
        WeakHandle {
            tx: self.tx.downgrade(),
            view: self.view.clone(),
            stats: self.stats.clone(),
        }
    }

    /// The latest published view.
    pub fn view(&self) -> Arc<View> {
        self.view.borrow().clone()
    }

    /// A receiver that wakes on each new view.
    pub fn subscribe(&self) -> watch::Receiver<Arc<View>> {
        self.view.clone()
    }

    pub fn stats(&self) -> &Arc<AggregatorStats> {
        &self.stats
    }

    /// Inputs waiting now.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Offers a collection without waiting (the poller's thread never blocks on us); a full
    /// queue drops it and counts it. False when the aggregator is gone.
    pub fn offer_collection(&self, c: Collection) -> bool {
        let input = Msg::Apply(Input::Collection(Box::new(c)), None);
        match self.tx.try_send(input) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stats
                    .collections_dropped
                    .fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Applies `input` between other inputs and returns the core's output. None when the
    /// aggregator is gone or the input panicked there.
    pub async fn apply(&self, input: Input) -> Option<Output> {
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Apply(input, Some(tx))).await?;
        rx.await.ok()
    }

    /// Answers `q` from the store between inputs (no view is published for it).
    pub async fn query(&self, q: Query) -> Option<Answer> {
        let (tx, rx) = oneshot::channel();
        self.send(Msg::Query(q, tx)).await?;
        rx.await.ok()
    }

    /// `query` for a caller outside the async runtime (it blocks that thread).
    pub fn query_blocking(&self, q: Query) -> Option<Answer> {
        let (tx, rx) = oneshot::channel();
        self.tx.blocking_send(Msg::Query(q, tx)).ok()?;
        rx.blocking_recv().ok()
    }

    /// Waits until every input sent before this call is in the published view (/metrics calls
    /// it before reading the view; API reads see the store itself). Returns at once when the
    /// aggregator is gone.
    pub async fn sync(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(Msg::Sync(tx)).await.is_some() {
            let _ = rx.await;
        }
    }

    /// Makes the aggregator apply what is already queued and then end, whoever still holds a
    /// handle (the daemon's shutdown: a handle left in a lingering task cannot keep it alive).
    pub async fn stop(&self) {
        let _ = self.tx.send(Msg::Stop).await;
    }

    #[cfg(test)]
    pub(super) fn send_blocking(&self, msg: Msg) -> bool {
        self.tx.blocking_send(msg).is_ok()
    }

    async fn send(&self, input: Msg) -> Option<()> {
        match self.tx.try_send(input) {
            Ok(()) => Some(()),
            Err(mpsc::error::TrySendError::Full(input)) => {
                self.stats.queue_full.fetch_add(1, Ordering::Relaxed);
                self.tx.send(input).await.ok()
            }
            Err(mpsc::error::TrySendError::Closed(_)) => None,
        }
    }
}
