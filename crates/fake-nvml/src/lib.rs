//! A scenario-driven `libnvidia-ml.so.1` for testing NVML readers without a GPU.
//!
//! Built as a `cdylib`, it exports the real NVML C ABI (see `ffi`); as an `rlib` it offers the
//! [`harness`] that builds and locates that library for other crates' tests and benches, and the
//! scenario model so tests can compute what the fake will report. The contract is README.md.

pub mod clock;
pub mod ffi;
pub mod handle;
pub mod harness;
pub mod readings;
pub mod ret;
pub mod scenario;
pub mod state;
pub mod value;

pub use clock::{ENV_T0, ENV_TIME};
pub use scenario::Scenario;
pub use state::ENV_SCENARIO;
