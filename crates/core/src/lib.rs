//! gpumon's domain core, a crate of its own so that nothing in it can reach a runtime or a part
//! above it: the typed inputs and the one `Core::apply` (`core::apply`, `core::input`), the store
//! and detection (`core::store`, `core::detect`), the domain types (`core::model`,
//! `core::trainer`), the JSON API's document (`core::snapshot`), the trace format and the
//! recording tap (`core::trace`, `core::tap`); with what they need from below, `util::bounded`
//! and `units`.
//!
//! The modules keep the paths they had in the gpumon crate (`crate::core::…`, `crate::util::…`,
//! `crate::units`), which re-exports them under the same names; the aggregator thread that owns
//! the store stays there, beside the runtime it runs on. docs/architecture.md draws the split.

pub mod core;
pub mod units;
pub mod util;
