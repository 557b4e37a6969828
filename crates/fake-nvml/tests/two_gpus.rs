//! The everyday scenario through nvml-wrapper (gpumon's real path) and raw C calls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use fake_nvml::ffi::types::{Memory, MemoryV2, ProcessInfo, ProcessInfoV1, MEMORY_V2_VERSION};
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use std::ffi::{c_char, c_uint, CStr};

fn nvml() -> &'static nvml_wrapper::Nvml {
    shared("two_gpus", 5.0)
}

const TOTAL: u64 = 85520809984;
const RESERVED: u64 = 567279616;

#[test]
fn system_information() {
    let n = nvml();
    assert_eq!(n.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(n.sys_nvml_version().unwrap(), "12.550.54.15");
    assert_eq!(n.sys_cuda_driver_version().unwrap(), 12040);
    assert_eq!(n.sys_process_name(4242, 64).unwrap(), "python");
    assert_eq!(
        n.sys_process_name(5001, 3).unwrap(),
        "Xo",
        "truncated to fit"
    );
    // A pid outside the scenario is looked up on the host, like the real library.
    let me = std::process::id();
    assert!(!n.sys_process_name(me, 64).unwrap().is_empty());
    let v1: unsafe extern "C" fn(*mut i32) -> u32 = sym("nvmlSystemGetCudaDriverVersion");
    let mut v = 0;
    assert_eq!(unsafe { v1(&mut v) }, 0);
    assert_eq!(v, 12040);
}

#[test]
fn identity() {
    let n = nvml();
    assert_eq!(n.device_count().unwrap(), 2);
    let d0 = n.device_by_index(0).unwrap();
    let d1 = n.device_by_index(1).unwrap();
    assert_eq!(d0.name().unwrap(), "NVIDIA H100 80GB HBM3");
    assert_eq!(
        d0.uuid().unwrap(),
        "GPU-11111111-2222-3333-4444-555555555555"
    );
    assert_eq!(
        d1.uuid().unwrap(),
        "GPU-66666666-7777-8888-9999-000000000000"
    );
    assert_eq!(d1.index().unwrap(), 1);
    let pci = d1.pci_info().unwrap();
    assert_eq!(pci.bus_id, "00000000:2A:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x2A, 0));
    assert_eq!(
        n.device_by_uuid("GPU-66666666-7777-8888-9999-000000000000")
            .unwrap()
            .index()
            .unwrap(),
        1
    );
    assert_eq!(
        n.device_by_pci_bus_id("00000000:17:00.0")
            .unwrap()
            .index()
            .unwrap(),
        0
    );
    assert!(matches!(
        n.device_by_uuid("GPU-nope"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(n.device_by_index(2), Err(NvmlError::InvalidArg)));
}

#[test]
fn memory_v2_and_v1_are_coherent() {
    let n = nvml();
    let m0 = n.device_by_index(0).unwrap().memory_info().unwrap();
    assert_eq!(m0.total, TOTAL);
    assert_eq!(m0.reserved, RESERVED);
    assert_eq!(m0.used, 21 * GIB);
    assert_eq!(m0.free, TOTAL - RESERVED - 21 * GIB);
    assert_eq!(m0.version, MEMORY_V2_VERSION);
    let d1 = n.device_by_index(1).unwrap();
    let m1 = d1.memory_info().unwrap();
    assert_eq!(m1.used, 256 * MIB + 40 * GIB + 16 * MIB);

    let v1: unsafe extern "C" fn(Handle, *mut Memory) -> u32 = sym("nvmlDeviceGetMemoryInfo");
    let mut m = Memory::default();
    assert_eq!(unsafe { v1(handle(&d1), &mut m) }, 0);
    assert_eq!(m.total, TOTAL);
    assert_eq!(m.used, m1.used + RESERVED, "v1 used includes reserved");
    assert_eq!(m.free, TOTAL - m.used);
}

#[test]
fn memory_v2_checks_the_struct_version() {
    let d = nvml().device_by_index(0).unwrap();
    let f: unsafe extern "C" fn(Handle, *mut MemoryV2) -> u32 = sym("nvmlDeviceGetMemoryInfo_v2");
    for bad in [
        0,
        1,
        2 << 24,
        40,
        (1 << 24) | 40,
        (2 << 24) | 32,
        (3 << 24) | 40,
    ] {
        let mut m = MemoryV2 {
            version: bad,
            ..Default::default()
        };
        assert_eq!(unsafe { f(handle(&d), &mut m) }, 25, "version {bad:#x}");
        assert_eq!(m.total, 0, "nothing written on mismatch");
    }
    let mut m = MemoryV2 {
        version: (std::mem::size_of::<MemoryV2>() as u32) | 2 << 24,
        ..Default::default()
    };
    assert_eq!(unsafe { f(handle(&d), &mut m) }, 0);
    assert_eq!(m.total, TOTAL);
    assert_eq!(unsafe { f(handle(&d), std::ptr::null_mut()) }, 2);
}

#[test]
fn sensors() {
    let n = nvml();
    let d0 = n.device_by_index(0).unwrap();
    let u = d0.utilization_rates().unwrap();
    assert_eq!((u.gpu, u.memory), (37, 20));
    assert_eq!(d0.temperature(TemperatureSensor::Gpu).unwrap(), 41);
    assert_eq!(d0.power_usage().unwrap(), 120000);
    assert_eq!(d0.enforced_power_limit().unwrap(), 700000);
    assert_eq!(d0.power_management_limit().unwrap(), 700000);
    assert_eq!(d0.fan_speed(0).unwrap(), 30);
    assert_eq!(d0.num_fans().unwrap(), 1);
    assert_eq!(d0.clock_info(Clock::Graphics).unwrap(), 1755);
    assert_eq!(d0.clock_info(Clock::Memory).unwrap(), 2619);
    assert_eq!(d0.max_clock_info(Clock::SM).unwrap(), 1980);
    let enc = d0.encoder_utilization().unwrap();
    assert_eq!((enc.utilization, enc.sampling_period), (0, 167000));
    let d1 = n.device_by_index(1).unwrap();
    assert_eq!(d1.temperature(TemperatureSensor::Gpu).unwrap(), 63);
    assert!(matches!(d1.fan_speed(0), Err(NvmlError::NotSupported)));
    assert!(matches!(
        d1.clock_info(Clock::Graphics),
        Err(NvmlError::NotSupported)
    ));
    assert!(matches!(
        d1.encoder_utilization(),
        Err(NvmlError::NotSupported)
    ));
}

#[test]
fn process_lists() {
    let n = nvml();
    let d0 = n.device_by_index(0).unwrap();
    let p = d0.running_compute_processes().unwrap();
    assert_eq!(
        p.iter().map(|p| p.pid).collect::<Vec<_>>(),
        vec![4242, 4243]
    );
    assert_eq!(p[1].used_gpu_memory, UsedGpuMemory::Used(20 * GIB));
    assert_eq!(
        (p[0].gpu_instance_id, p[0].compute_instance_id),
        (None, None)
    );
    assert_eq!(d0.running_compute_processes_count().unwrap(), 2);
    assert!(d0.running_graphics_processes().unwrap().is_empty());
    let d1 = n.device_by_index(1).unwrap();
    let g = d1.running_graphics_processes().unwrap();
    assert_eq!(g.len(), 1);
    assert_eq!(
        (g[0].pid, g[0].used_gpu_memory.clone()),
        (5001, UsedGpuMemory::Used(16 * MIB))
    );
    assert_eq!(d1.running_compute_processes().unwrap().len(), 1);
}

#[test]
fn two_call_pattern_raw() {
    let d = nvml().device_by_index(0).unwrap();
    let h = handle(&d);
    for name in [
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
    ] {
        let f: ProcFn = sym(name);
        let mut n: c_uint = 0;
        assert_eq!(
            unsafe { f(h, &mut n, std::ptr::null_mut()) },
            7,
            "{name}: size query"
        );
        assert_eq!(n, 2);
        let mut buf = [ProcessInfo::default(); 5];
        let mut n: c_uint = 1;
        assert_eq!(
            unsafe { f(h, &mut n, buf.as_mut_ptr()) },
            7,
            "{name}: too small"
        );
        assert_eq!(n, 2, "{name}: needed count reported");
        assert_eq!(
            buf[0],
            ProcessInfo::default(),
            "{name}: nothing written when too small"
        );
        let mut n: c_uint = 5;
        assert_eq!(unsafe { f(h, &mut n, buf.as_mut_ptr()) }, 0);
        assert_eq!(n, 2);
        assert_eq!(
            buf[0],
            ProcessInfo {
                pid: 4242,
                used_gpu_memory: GIB,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX
            }
        );
        assert_eq!(unsafe { f(h, std::ptr::null_mut(), buf.as_mut_ptr()) }, 2);
    }
    // No graphics processes on GPU 0: the size query succeeds with 0.
    let f: ProcFn = sym("nvmlDeviceGetGraphicsRunningProcesses_v3");
    let mut n: c_uint = 0;
    assert_eq!(unsafe { f(h, &mut n, std::ptr::null_mut()) }, 0);
    assert_eq!(n, 0);
    // The legacy unversioned symbol writes the 16-byte v1 struct.
    let v1: unsafe extern "C" fn(Handle, *mut c_uint, *mut ProcessInfoV1) -> u32 =
        sym("nvmlDeviceGetComputeRunningProcesses");
    let mut buf = [ProcessInfoV1::default(); 2];
    let mut n: c_uint = 2;
    assert_eq!(unsafe { v1(h, &mut n, buf.as_mut_ptr()) }, 0);
    assert_eq!(
        buf[1],
        ProcessInfoV1 {
            pid: 4243,
            used_gpu_memory: 20 * GIB
        }
    );
}

#[test]
fn bad_handles_and_arguments() {
    nvml();
    let name: unsafe extern "C" fn(Handle, *mut c_char, c_uint) -> u32 = sym("nvmlDeviceGetName");
    let mut buf = [0 as c_char; 96];
    for h in [std::ptr::null_mut(), 0x1234 as Handle, usize::MAX as Handle] {
        assert_eq!(unsafe { name(h, buf.as_mut_ptr(), 96) }, 2, "handle {h:?}");
    }
    let d = nvml().device_by_index(0).unwrap();
    assert_eq!(
        unsafe { name(handle(&d), buf.as_mut_ptr(), 5) },
        7,
        "buffer too small"
    );
    assert_eq!(unsafe { name(handle(&d), std::ptr::null_mut(), 96) }, 2);
    let temp: unsafe extern "C" fn(Handle, c_uint, *mut c_uint) -> u32 =
        sym("nvmlDeviceGetTemperature");
    let mut t = 0;
    assert_eq!(unsafe { temp(handle(&d), 7, &mut t) }, 2, "unknown sensor");
}

#[test]
fn error_strings_and_refcount() {
    nvml();
    let es: unsafe extern "C" fn(u32) -> *const c_char = sym("nvmlErrorString");
    let s = |c| {
        unsafe { CStr::from_ptr(es(c)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(s(15), "GPU is lost");
    assert_eq!(s(12345), "Unknown Error");
    // An extra init/shutdown pair leaves the shared handle working.
    let init: unsafe extern "C" fn() -> u32 = sym("nvmlInit_v2");
    let shutdown: unsafe extern "C" fn() -> u32 = sym("nvmlShutdown");
    assert_eq!(unsafe { init() }, 0);
    assert_eq!(unsafe { shutdown() }, 0);
    assert_eq!(nvml().device_count().unwrap(), 2);
}
