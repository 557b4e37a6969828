//! The middle of the daemon: the aggregator that owns the state and the view it publishes.

pub mod aggregator;
pub mod trainer;
pub mod view;
