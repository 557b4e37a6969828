//! The middle: the domain core (the gpumon-core crate, re-exported here under the paths it always
//! had) and the aggregator thread that owns its store and publishes the view. The aggregator
//! stays in this crate because it runs on tokio, which the core crate must not depend on.

pub use gpumon_core::core::{
    apply, categories, detect, input, jobs, ledger, message, model, query, snapshot, store, tap,
    trace, trainer, view,
};

pub mod aggregator;

#[cfg(test)]
mod tests;
