//! nvmlDeviceGetMemoryInfo (v1) and nvmlDeviceGetMemoryInfo_v2.

use super::types::{Memory, MemoryV2, MEMORY_V2_VERSION};
use super::{device_call, put};
use crate::handle::{Dev, NvmlDevice};
use crate::readings::{self, Mem};
use crate::ret::{self, Ret};
use crate::scenario::{Call, Gpu};

fn mem(gpu: &Gpu, dev: Dev, t: f64) -> Mem {
    match dev {
        Dev::Gpu(_) => readings::memory(gpu, None, t),
        Dev::Mig(_, m) => readings::memory(gpu, Some(m), t),
    }
}

/// v1: `used` includes driver-reserved memory, as real drivers report it.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut Memory) -> Ret {
    device_call(device, Call::Memory, |ctx, dev, gpu| {
        let m = mem(gpu, dev, ctx.t);
        let v1 = Memory {
            total: m.total,
            free: m.v1_free(),
            used: m.v1_used(),
        };
        unsafe { put(memory, v1) }
    })
}

/// v2: the caller must set `version` to NVML_STRUCT_VERSION(Memory, 2); anything else is
/// NVML_ERROR_ARGUMENT_VERSION_MISMATCH, as in the real library.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    memory: *mut MemoryV2,
) -> Ret {
    device_call(device, Call::Memory, |ctx, dev, gpu| {
        if memory.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller passes an nvmlMemory_v2_t whose version it has set.
        let version = unsafe { std::ptr::addr_of!((*memory).version).read_unaligned() };
        if version != MEMORY_V2_VERSION {
            return Err(ret::ARGUMENT_VERSION_MISMATCH);
        }
        let m = mem(gpu, dev, ctx.t);
        let v2 = MemoryV2 {
            version,
            total: m.total,
            reserved: m.reserved,
            free: m.free(),
            used: m.used,
        };
        unsafe { put(memory, v2) }
    })
}
