//! Where GPU readings come from. The daemon's poller owns one `GpuSource` and calls it on its own
//! thread; nothing else touches NVML.

pub mod ingest;
pub mod kubelet;
pub mod nvml;
pub mod poller;
pub mod procinfo;
pub mod replay;

use crate::core::model::{NodeReading, ProcView};

/// One collector, one method (the node_exporter shape).
pub trait GpuSource: Send {
    /// Reads every GPU and process once. `Err` means nothing could be read at all (library missing,
    /// init failed); trouble with one GPU is reported inside the reading instead.
    fn collect(&mut self) -> Result<NodeReading, SourceError>;

    /// Which processes the source's /proc shows: whether a listed pid missing there has exited
    /// (orphaned memory). None when the source cannot say.
    fn proc_view(&mut self) -> Option<ProcView> {
        None
    }

    /// What the library is when it is not a real NVML (crates/fake-nvml's identity): its
    /// readings are a scenario's, not this machine's. None for a real NVML.
    fn simulated(&mut self) -> Option<String> {
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot load the NVML library {path:?}: {reason}. Install the NVIDIA driver, or point --nvml-lib (GPUMON_NVML_LIB) at libnvidia-ml.so.1")]
    LibraryMissing { path: String, reason: String },
    #[error("NVML init failed using {path:?}: {reason}")]
    InitFailed { path: String, reason: String },
    #[error("NVML query failed: {0}")]
    Query(String),
}
