//! Running-process lists: compute, graphics and MPS, in the v1 and v2/v3 struct layouts.
//!
//! The real two-call pattern: a call whose `*infoCount` is smaller than the number of processes
//! (typically 0 with a NULL buffer, to ask for the size) returns NVML_ERROR_INSUFFICIENT_SIZE
//! and stores the needed count; with no processes it returns SUCCESS and a count of 0.

use super::types::{ProcessInfo, ProcessInfoV1, VALUE_NOT_AVAILABLE};
use super::{device_call, put};
use crate::handle::{Dev, NvmlDevice};
use crate::readings::{self, ListKind, ProcEntry};
use crate::ret::{self, Ret};
use crate::scenario::Call;
use std::ffi::c_uint;

fn list<T>(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut T,
    kind: ListKind,
    make: fn(&ProcEntry) -> T,
) -> Ret {
    device_call(device, Call::Processes, |ctx, dev, gpu| {
        if count.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let mig = match dev {
            Dev::Gpu(_) => None,
            Dev::Mig(_, m) => Some(m),
        };
        let procs = readings::process_list(gpu, mig, ctx.t, kind);
        let n = c_uint::try_from(procs.len()).unwrap_or(c_uint::MAX);
        // SAFETY: checked non-null; nvml.h makes it a valid in/out unsigned int.
        let capacity = unsafe { count.read_unaligned() };
        if n > capacity || (n > 0 && infos.is_null()) {
            unsafe { put(count, n) }?;
            return Err(ret::INSUFFICIENT_SIZE);
        }
        for (i, p) in procs.iter().enumerate() {
            // SAFETY: i < n <= capacity, and the caller's buffer holds `capacity` entries.
            unsafe { put(infos.add(i), make(p)) }?;
        }
        unsafe { put(count, n) }
    })
}

fn v2(p: &ProcEntry) -> ProcessInfo {
    ProcessInfo {
        pid: p.pid,
        used_gpu_memory: p.used.unwrap_or(VALUE_NOT_AVAILABLE),
        gpu_instance_id: p.gpu_instance_id,
        compute_instance_id: p.compute_instance_id,
    }
}

fn v1(p: &ProcEntry) -> ProcessInfoV1 {
    ProcessInfoV1 {
        pid: p.pid,
        used_gpu_memory: p.used.unwrap_or(VALUE_NOT_AVAILABLE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    list(device, info_count, infos, ListKind::Compute, v2)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    list(device, info_count, infos, ListKind::Compute, v2)
}

/// The unversioned legacy symbol uses the 16-byte `nvmlProcessInfo_v1_t`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> Ret {
    list(device, info_count, infos, ListKind::Compute, v1)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    list(device, info_count, infos, ListKind::Graphics, v2)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    list(device, info_count, infos, ListKind::Graphics, v2)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> Ret {
    list(device, info_count, infos, ListKind::Graphics, v1)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    list(device, info_count, infos, ListKind::Mps, v2)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    device: NvmlDevice,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    list(device, info_count, infos, ListKind::Mps, v2)
}
