//! What the aggregator publishes after each batch of inputs: an immutable, typed picture of the
//! node that /metrics, readiness and the alert thread read without taking any lock. Parts that
//! change only with a collection are shared (`Arc`) from one view to the next, so publishing a
//! view after a trainer's batch copies no GPU or process data.

use std::sync::Arc;

use crate::core::model::NodeReading;
use crate::core::store::{NvmlStatus, Store};

#[derive(Debug, Clone, Default)]
pub struct View {
    /// Bumped by every publish.
    pub seq: u64,
    /// Bumped by every NVML collection (a successful one or not): caches derived from the
    /// NVML part key on it.
    pub collection: u64,
    pub nvml: NvmlStatus,
    /// The latest successful collection; none while NVML is down.
    pub latest: Option<Arc<NodeReading>>,
    /// The latest collection's NVML families as exposition text (encoded by the poller, or
    /// when the view is made for a store that no poller fed).
    pub gpu_text: Arc<str>,
    /// Trainer and finding families as exposition text, encoded from the sessions when a scrape
    /// last synced (`Handle::sync`) with changes waiting; stale in views published between.
    pub trainer_text: Arc<str>,
}

impl View {
    /// The view of `store`, with its two texts already encoded.
    pub fn of(store: &Store, gpu_text: Arc<str>, trainer_text: Arc<str>, seq: u64) -> Self {
        Self {
            seq,
            collection: store.generation(),
            nvml: store.nvml.clone(),
            latest: store.latest_shared(),
            gpu_text,
            trainer_text,
        }
    }

    /// Ready once the first collection attempt has finished, whatever its outcome: from then
    /// on /metrics says something true (including `gpumon_nvml_up 0`).
    pub fn ready(&self) -> bool {
        self.nvml.last_poll_ts.is_some()
    }
}
