//! Small pieces several parts need, written once: a doubling backoff, a bounded queue that
//! counts what it drops, the one rule for showing a trainer's text on a terminal, seconds as
//! settings files write them, and the metric family text and `Health` trait every part reports
//! its own counters with, and stderr that never panics.

pub mod backoff;
// In gpumon-core, which the core's store and findings use; re-exported under its old path.
pub use gpumon_core::util::bounded;
pub mod expand;
pub mod family;
pub mod health;
pub mod pid_map;
pub mod printable;
pub mod seconds;
pub mod stderr;
