//! gpumon: a live GPU memory monitor for machines that train models.
//!
//! Data flows one way: `sources` (NVML, polled by `poller` on its own thread) → `store`
//! (bounded history) → `outputs` (/metrics, JSON API). `daemon` wires them; `cli` and `config`
//! decide how; `status` is the one-shot reader and `tui` the live one.

pub mod alerts;
pub mod analyze;
pub mod cli;
pub mod config;
pub mod core;
pub mod daemon;
pub mod daemon_client;
pub mod local;
pub mod demo;
pub mod detect;
pub mod ingest;
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
