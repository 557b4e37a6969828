//! gpumon: a live GPU memory monitor for machines that train models.
//!
//! Data flows one way, and the tree follows it:
//! - `sources`: NVML (`nvml`, `procinfo`, `kubelet`), read by the `poller` on its own thread,
//!   and trainers over the `ingest` socket. Both send their inputs to the aggregator.
//! - `core`: the `aggregator`, the one owner of the `store` and of `detect`ion, which publishes
//!   an immutable `view` after each batch; the domain types (`model`, `trainer`) and the API's
//!   document (`snapshot`). All of it but the aggregator (which runs on tokio) is the gpumon-core
//!   crate (crates/core), re-exported here under the same paths with `units` and
//!   `util::bounded`: that crate cannot reach tokio, HTTP, the terminal, NVML, nor any other
//!   module here.
//! - `outputs`: /metrics and the JSON API (`http`, `prometheus`) read the view or ask the
//!   aggregator; `alerts` gets finding transitions on a bounded channel; `record` writes traces.
//! - `frontends`: `status`, `tui`, `analyze`, `demo`, and `local` (the daemon's own poller and
//!   aggregator in-process, for when no daemon runs).
//!
//! `daemon` wires them; `cli` and `config` decide how.

pub mod cli;
pub mod config;
pub mod core;
pub mod daemon;
pub mod daemon_client;
pub mod frontends;
pub mod malloc;
pub mod outputs;
pub mod sources;
// In gpumon-core (its detection messages format bytes); re-exported under its old path.
pub use gpumon_core::units;
pub mod util;
