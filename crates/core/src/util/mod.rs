//! The parts of gpumon's `util` the core needs: a bounded queue that counts what it drops. The
//! rest of `util` (backoff, metric families, health) stays in the gpumon crate, which re-exports
//! this module's items beside its own.

pub mod bounded;
