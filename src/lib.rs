//! gpumon: a live GPU memory monitor for machines that train models.
//!
//! Data flows one way. `sources` bring inputs: NVML, read by the `poller` on its own thread, and
//! trainers over the `ingest` socket. Both send them to the aggregator (`core::aggregator`), the
//! one owner of the `store` and of `detect`ion, which publishes an immutable `core::view` after
//! each batch. `outputs` read that view (/metrics) or ask the aggregator (the JSON API), and
//! finding transitions reach the `alerts` thread on a bounded channel. `daemon` wires them;
//! `status`, `tui`, `analyze` and `demo` are the front ends (`local` runs the daemon's own
//! poller and aggregator in-process for them when no daemon runs).

pub mod alerts;
pub mod analyze;
pub mod cli;
pub mod config;
pub mod core;
pub mod daemon;
pub mod daemon_client;
pub mod demo;
pub mod detect;
pub mod ingest;
pub mod local;
pub mod malloc;
pub mod model;
pub mod outputs;
pub mod poller;
pub mod snapshot;
pub mod sources;
pub mod status;
pub mod store;
pub mod tui;
pub mod units;
pub mod util;
