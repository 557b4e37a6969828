//! The middle: the core that applies every typed input to the store (apply.rs, input.rs), the
//! view the aggregator publishes (view.rs), the reads it answers (query.rs); the domain types;
//! the JSON API's document; the trace file format and the recording tap. The aggregator thread
//! itself runs on tokio, so it lives in the gpumon crate (its `core::aggregator`).

pub mod apply;
pub mod categories;
pub mod detect;
pub mod input;
pub mod jobs;
pub mod ledger;
pub mod message;
pub mod model;
pub mod query;
pub mod snapshot;
pub mod store;
pub mod tap;
pub mod trace;
pub mod trainer;
pub mod unified;
pub mod view;
