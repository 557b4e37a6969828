//! A GPU that reports per-process memory as "n/a" and has no sensors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use fake_nvml::ffi::types::VALUE_NOT_AVAILABLE;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

#[test]
fn na_memory_and_unsupported_sensors() {
    let n = shared("not_available", 0.0);
    let d = n.device_by_index(0).unwrap();
    let compute = d.running_compute_processes().unwrap();
    assert_eq!(compute.len(), 1);
    assert_eq!(
        (compute[0].pid, compute[0].used_gpu_memory.clone()),
        (6001, UsedGpuMemory::Unavailable)
    );
    let graphics = d.running_graphics_processes().unwrap();
    assert_eq!(graphics[0].used_gpu_memory, UsedGpuMemory::Unavailable);
    assert_eq!(
        raw_compute_processes(handle(&d))[0].used_gpu_memory,
        VALUE_NOT_AVAILABLE
    );

    let m = d.memory_info().unwrap();
    assert_eq!(
        (m.total, m.used, m.reserved),
        (17171480576, 3 * GIB, 0),
        "n/a processes add nothing"
    );

    assert!(matches!(
        d.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(d.power_usage(), Err(NvmlError::NotSupported)));
    assert!(matches!(
        d.enforced_power_limit(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(d.fan_speed(0), Err(NvmlError::NotSupported)));
    assert!(matches!(
        d.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
}
