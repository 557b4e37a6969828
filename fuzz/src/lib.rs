//! The checks behind each fuzz target. They live here, not in the targets, so that
//! `tests/fuzz_corpus.rs` replays the kept corpus through exactly the same code on stable.

pub mod conn;
pub mod lines;
pub mod parse;
