//! The GB10-shaped unified-memory GPU as nvml-wrapper sees it: memory info (v1 and v2) answers
//! NOT_SUPPORTED, as on a DGX Spark, while the processes are listed with their memory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

#[test]
fn no_frame_buffer_figure_but_the_processes_are_listed() {
    let n = shared("gb10", 0.0);
    let d = n.device_by_index(0).unwrap();
    assert_eq!(d.name().unwrap(), "NVIDIA GB10");
    assert!(matches!(d.memory_info(), Err(NvmlError::NotSupported)));
    let compute = d.running_compute_processes().unwrap();
    let got: Vec<(u32, UsedGpuMemory)> = compute
        .iter()
        .map(|p| (p.pid, p.used_gpu_memory.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (6100, UsedGpuMemory::Used(20 * GIB)),
            (6101, UsedGpuMemory::Used(4 * GIB)),
        ]
    );
    assert!(d.mps_running_compute_processes().unwrap().is_empty());
}
