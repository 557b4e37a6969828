//! Small pieces several parts need, written once: a doubling backoff and a bounded queue that
//! counts what it drops.

pub mod backoff;
pub mod bounded;
pub mod pid_map;
