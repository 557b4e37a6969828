//! The middle: the core that applies every typed input to the store (apply.rs, input.rs), the
//! aggregator thread that owns it and publishes the view, the reads it answers (query.rs); the
//! domain types; the JSON API's document; the trace file format and the recording tap.

pub mod aggregator;
pub mod apply;
pub mod detect;
pub mod input;
pub mod ledger;
pub mod message;
pub mod model;
pub mod query;
pub mod snapshot;
pub mod store;
pub mod tap;
pub mod trace;
pub mod trainer;
pub mod view;
