//! Trainer ingest: the Unix-socket protocol that instrumented trainers push allocator stats
//! over (docs/protocol.md).

pub mod batch;
pub mod conn;
#[cfg(test)]
pub(crate) mod drive;
mod health;
pub mod line_budget;
pub mod lines;
pub mod protocol;
pub mod resume;
pub mod server;
pub mod socket;
pub mod stats;
