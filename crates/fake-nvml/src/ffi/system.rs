//! nvmlSystem*: versions and process names.

use super::{guard, put, put_str, Ctx};
use crate::readings;
use crate::ret::{self, Ret};
use std::ffi::{c_char, c_int, c_uint};

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        unsafe { put_str(version, length, &ctx.scenario().driver_version) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        unsafe { put_str(version, length, &ctx.scenario().nvml_version) }
    })
}

fn cuda_version(out: *mut c_int) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        unsafe { put(out, ctx.scenario().cuda_driver_version) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(cuda_driver_version: *mut c_int) -> Ret {
    cuda_version(cuda_driver_version)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version: *mut c_int) -> Ret {
    cuda_version(cuda_driver_version)
}

/// Truncates to fit `length` (the real call documents no INSUFFICIENT_SIZE here).
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetProcessName(
    pid: c_uint,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        if name.is_null() || length == 0 {
            return Err(ret::INVALID_ARGUMENT);
        }
        let full = readings::process_name(ctx.scenario(), pid).ok_or(ret::NOT_FOUND)?;
        let mut cut = full.len().min(length as usize - 1);
        while !full.is_char_boundary(cut) {
            cut -= 1;
        }
        unsafe { put_str(name, length, &full[..cut]) }
    })
}

/// What the library is, for a reader that asks (gpumon does): "fake-nvml 0.1.0; pids: scenario"
/// or "…; pids: host" (the scenario's `host_pids`). No real NVML exports this symbol, so its
/// presence alone tells a fake library, whatever driver version a scenario claims.
#[no_mangle]
pub unsafe extern "C" fn fakeNvmlIdentity(out: *mut c_char, length: c_uint) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        let pids = if ctx.scenario().host_pids {
            "host"
        } else {
            "scenario"
        };
        let id = format!("fake-nvml {}; pids: {pids}", env!("CARGO_PKG_VERSION"));
        unsafe { put_str(out, length, &id) }
    })
}
