//! Small pieces several parts need, written once: a doubling backoff, a bounded queue that
//! counts what it drops, the one rule for showing a trainer's text on a terminal, and seconds as
//! settings files write them.

pub mod backoff;
pub mod bounded;
pub mod expand;
pub mod http_head;
pub mod pid_map;
pub mod printable;
pub mod seconds;
