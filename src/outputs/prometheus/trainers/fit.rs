//! The batch fit a trainer's series report, against the limit the API's session view uses.
//! Core's `snapshot::batch_fit_of` is private to the snapshot; this is the same computation
//! (the latest sample's `Obs::limit` and its inactive split bytes), so /metrics and the API
//! give one `largest_safe_batch`. If core makes that function public, call it instead.

use crate::core::categories::BatchFit;
use crate::core::detect::Obs;
use crate::core::store::sessions::Session;

/// The fit of `s`'s latest split; None without a split, a sample, or a limit to fit under.
pub fn batch_fit(s: &Session) -> Option<BatchFit> {
    let (_, last) = s.last_sample.as_ref()?;
    s.categories.latest()?;
    // Only `limit()` is read: it needs the sample and the cap, nothing else of an Obs.
    let obs = Obs {
        sample: last,
        retries_total: 0,
        ooms_total: 0,
        alloc_limit: s.alloc_limit,
        outside: None,
        categories: None,
        world_size: None,
    };
    s.categories.fit(obs.limit(), last.stats.inactive_split)
}
