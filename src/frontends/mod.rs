//! What people run to look: the one-shot `status`, the live `tui`, the offline `analyze`, the
//! self-contained `demo`, and `local`, which runs the daemon's poller and aggregator in-process
//! for them when no daemon answers.

pub mod analyze;
pub mod demo;
pub mod local;
pub mod status;
pub mod tui;
