//! The middle: the aggregator that owns the store and detection and publishes the view; the
//! domain types; the JSON API's document; the trace file format.

pub mod aggregator;
pub mod detect;
pub mod ledger;
pub mod model;
pub mod snapshot;
pub mod store;
pub mod trace;
pub mod trainer;
pub mod view;
