//! Tests of the core crate's modules that need parts above it (ingest's protocol, the TUI's
//! fixtures): that crate cannot see them, so its tests of them run here, on its public API.

mod arm;
mod attribute;
mod kept;
