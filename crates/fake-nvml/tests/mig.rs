//! MIG: mode, enumeration with an empty slot, MIG handle identity, memory and processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use std::ffi::c_uint;

fn nvml() -> &'static nvml_wrapper::Nvml {
    shared("mig", 1.0)
}

fn instance_id(name: &str, h: Handle) -> (u32, u32) {
    let f: unsafe extern "C" fn(Handle, *mut c_uint) -> u32 = sym(name);
    let mut id = 0;
    let r = unsafe { f(h, &mut id) };
    (r, id)
}

#[test]
fn enumeration() {
    let n = nvml();
    assert_eq!(
        n.device_count().unwrap(),
        2,
        "MIG devices are not counted as GPUs"
    );
    let gpu = n.device_by_index(0).unwrap();
    let mode = gpu.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(gpu.mig_device_count().unwrap(), 7);
    assert!(!gpu.mig_is_mig_device_handle().unwrap());

    let mut found = vec![];
    for i in 0..7 {
        match gpu.mig_device_by_index(i) {
            Ok(m) => found.push((i, m.uuid().unwrap())),
            Err(NvmlError::NotFound) => {}
            Err(e) => panic!("slot {i}: {e:?}"),
        }
    }
    assert_eq!(
        found,
        vec![
            (0, "MIG-11111111-0000-4000-8000-000000000000".to_string()),
            (1, "MIG-22222222-0000-4000-8000-000000000000".to_string()),
            (3, "MIG-33333333-0000-4000-8000-000000000000".to_string()),
        ]
    );
    assert!(matches!(
        gpu.mig_device_by_index(7),
        Err(NvmlError::InvalidArg)
    ));

    let other = n.device_by_index(1).unwrap();
    assert!(matches!(other.mig_mode(), Err(NvmlError::NotSupported)));
    assert_eq!(other.mig_device_count().unwrap(), 0);
}

#[test]
fn mig_handles() {
    let n = nvml();
    let gpu = n.device_by_index(0).unwrap();
    let m0 = gpu.mig_device_by_index(0).unwrap();
    assert!(m0.mig_is_mig_device_handle().unwrap());
    assert_eq!(m0.name().unwrap(), "NVIDIA A100-SXM4-40GB MIG 3g.20gb");
    assert_eq!(
        m0.mig_parent_device().unwrap().uuid().unwrap(),
        gpu.uuid().unwrap()
    );
    assert_eq!(
        instance_id("nvmlDeviceGetGpuInstanceId", handle(&m0)),
        (0, 1)
    );
    assert_eq!(
        instance_id("nvmlDeviceGetComputeInstanceId", handle(&m0)),
        (0, 0)
    );
    assert_eq!(
        instance_id("nvmlDeviceGetGpuInstanceId", handle(&gpu)).0,
        3,
        "physical GPU: NOT_SUPPORTED"
    );
    assert!(matches!(
        gpu.mig_parent_device(),
        Err(NvmlError::InvalidArg)
    ));

    // What a MIG handle does not answer.
    assert!(matches!(
        m0.utilization_rates(),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        m0.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(m0.power_usage(), Err(NvmlError::NotSupported)));

    // Looked up by UUID, a MIG device is found too.
    let m3 = n
        .device_by_uuid("MIG-33333333-0000-4000-8000-000000000000")
        .unwrap();
    assert_eq!(
        instance_id("nvmlDeviceGetGpuInstanceId", handle(&m3)),
        (0, 13)
    );
}

#[test]
fn mig_memory_and_processes() {
    let n = nvml();
    let gpu = n.device_by_index(0).unwrap();
    let m0 = gpu.mig_device_by_index(0).unwrap();
    let mem = m0.memory_info().unwrap();
    assert_eq!(
        (mem.total, mem.used, mem.reserved),
        (20937965568, 10 * GIB, 0)
    );
    assert_eq!(mem.free, 20937965568 - 10 * GIB);
    let p = m0.running_compute_processes().unwrap();
    assert_eq!(
        p.iter().map(|p| p.pid).collect::<Vec<_>>(),
        vec![7001, 7002]
    );
    assert_eq!(
        (p[0].gpu_instance_id, p[0].compute_instance_id),
        (Some(1), Some(0))
    );

    let m3 = gpu.mig_device_by_index(3).unwrap();
    assert_eq!(m3.memory_info().unwrap().used, GIB + 12 * MIB);
    let p = m3.running_compute_processes().unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].pid, p[0].gpu_instance_id), (7004, Some(13)));

    // The parent lists every process with its instance ids and counts all their memory.
    let all = gpu.running_compute_processes().unwrap();
    let ids: Vec<_> = all
        .iter()
        .map(|p| (p.pid, p.gpu_instance_id.unwrap()))
        .collect();
    assert_eq!(ids, vec![(7001, 1), (7002, 1), (7003, 5), (7004, 13)]);
    assert_eq!(gpu.memory_info().unwrap().used, 15 * GIB);

    let plain = n.device_by_index(1).unwrap();
    let p = plain.running_compute_processes().unwrap();
    assert_eq!(
        (p[0].gpu_instance_id, p[0].used_gpu_memory.clone()),
        (None, UsedGpuMemory::Used(3 * GIB))
    );
}
