//! Multi-Instance GPU: mode, enumeration, and the identity of MIG device handles.

use super::{device_call, put};
use crate::handle::{self, Dev, NvmlDevice};
use crate::ret::{self, Ret};
use crate::scenario::Call;
use std::ffi::c_uint;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: NvmlDevice,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> Ret {
    device_call(device, Call::Mig, |_, dev, gpu| {
        if matches!(dev, Dev::Mig(..)) || !gpu.mig_capable() {
            return Err(ret::NOT_SUPPORTED);
        }
        if pending_mode.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let mode = c_uint::from(gpu.mig_mode);
        unsafe {
            put(current_mode, mode)?;
            put(pending_mode, mode)
        }
    })
}

/// 0 for a GPU without MIG support, as the real call reports.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: NvmlDevice,
    count: *mut c_uint,
) -> Ret {
    device_call(device, Call::Mig, |_, dev, gpu| {
        if matches!(dev, Dev::Mig(..)) {
            return Err(ret::NOT_SUPPORTED);
        }
        unsafe { put(count, gpu.max_mig_devices()) }
    })
}

/// Slots at or past the max count are INVALID_ARGUMENT; empty slots (or MIG mode off) NOT_FOUND.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: NvmlDevice,
    index: c_uint,
    mig_device: *mut NvmlDevice,
) -> Ret {
    device_call(device, Call::Mig, |ctx, dev, gpu| {
        let Dev::Gpu(g) = dev else {
            return Err(ret::INVALID_ARGUMENT);
        };
        if !gpu.mig_capable() {
            return Err(ret::NOT_SUPPORTED);
        }
        if index >= gpu.max_mig_devices() {
            return Err(ret::INVALID_ARGUMENT);
        }
        let m = gpu
            .mig_at_slot(index)
            .filter(|_| gpu.mig_mode)
            .ok_or(ret::NOT_FOUND)?;
        unsafe { put(mig_device, handle::encode(Dev::Mig(g, m), ctx.scenario())) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: NvmlDevice,
    is_mig_device: *mut c_uint,
) -> Ret {
    device_call(device, Call::Mig, |_, dev, _| unsafe {
        put(is_mig_device, c_uint::from(matches!(dev, Dev::Mig(..))))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: NvmlDevice,
    device: *mut NvmlDevice,
) -> Ret {
    device_call(mig_device, Call::Mig, |ctx, dev, _| {
        let Dev::Mig(g, _) = dev else {
            return Err(ret::INVALID_ARGUMENT);
        };
        unsafe { put(device, handle::encode(Dev::Gpu(g), ctx.scenario())) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: NvmlDevice, id: *mut c_uint) -> Ret {
    device_call(device, Call::Mig, |_, dev, gpu| {
        let Dev::Mig(_, m) = dev else {
            return Err(ret::NOT_SUPPORTED);
        };
        let mig = gpu.migs.get(m).ok_or(ret::INVALID_ARGUMENT)?;
        unsafe { put(id, mig.gpu_instance_id) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: NvmlDevice,
    id: *mut c_uint,
) -> Ret {
    device_call(device, Call::Mig, |_, dev, gpu| {
        let Dev::Mig(_, m) = dev else {
            return Err(ret::NOT_SUPPORTED);
        };
        let mig = gpu.migs.get(m).ok_or(ret::INVALID_ARGUMENT)?;
        unsafe { put(id, mig.compute_instance_id) }
    })
}
