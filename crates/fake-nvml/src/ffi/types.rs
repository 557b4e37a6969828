//! C structs of nvml.h that cross the ABI, laid out exactly as the real header (checked by the
//! size assertions below). Public so tests can call raw symbols with them.

use std::ffi::c_char;
use std::mem::size_of;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `NVML_STRUCT_VERSION(Memory, 2)`: the struct size in the low bits, the version in the top byte.
pub const MEMORY_V2_VERSION: u32 = size_of::<MemoryV2>() as u32 | 2 << 24;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Utilization {
    pub gpu: u32,
    pub memory: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub bus_id: [c_char; 32],
}

/// `nvmlProcessInfo_t` (= `_v2_t`), used by the `_v2` and `_v3` process-list calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// `nvmlProcessInfo_v1_t`, used by the unversioned legacy symbols.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessInfoV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
}

/// `NVML_VALUE_NOT_AVAILABLE` as an unsigned long long.
pub const VALUE_NOT_AVAILABLE: u64 = u64::MAX;

const _: () = assert!(size_of::<Memory>() == 24);
const _: () = assert!(size_of::<MemoryV2>() == 40);
const _: () = assert!(MEMORY_V2_VERSION == 0x0200_0028);
const _: () = assert!(size_of::<PciInfo>() == 68);
const _: () = assert!(size_of::<ProcessInfo>() == 24);
const _: () = assert!(size_of::<ProcessInfoV1>() == 16);
