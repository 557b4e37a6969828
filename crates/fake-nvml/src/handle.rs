//! Device handles. `nvmlDevice_t` is an opaque pointer; ours are tagged integers that are never
//! dereferenced, so a stale or foreign handle is detected instead of read.

use crate::scenario::Scenario;
use std::ffi::c_void;

pub type NvmlDevice = *mut c_void;

const _: () = assert!(usize::BITS == 64, "handle encoding assumes 64-bit pointers");

const TAG: usize = 0xFA4E << 48;
const TAG_MASK: usize = 0xFFFF << 48;
const KIND_GPU: usize = 1 << 40;
const KIND_MIG: usize = 2 << 40;
const KIND_MASK: usize = 0xFF << 40;

/// A decoded, validated handle: a physical GPU, or a MIG device (GPU index, position in the
/// GPU's `migs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    Gpu(usize),
    Mig(usize, usize),
}

impl Dev {
    pub fn gpu(self) -> usize {
        match self {
            Dev::Gpu(g) | Dev::Mig(g, _) => g,
        }
    }
}

pub fn encode(dev: Dev, scenario: &Scenario) -> NvmlDevice {
    let bits = match dev {
        Dev::Gpu(g) => TAG | KIND_GPU | (g & 0xFFFF) << 16,
        Dev::Mig(g, m) => {
            // The handle carries the MIG slot, which is what callers enumerate by.
            let slot = scenario
                .gpus
                .get(g)
                .and_then(|gpu| gpu.migs.get(m))
                .and_then(|mig| mig.index)
                .unwrap_or(m as u32) as usize;
            TAG | KIND_MIG | (g & 0xFFFF) << 16 | (slot & 0xFFFF)
        }
    };
    bits as NvmlDevice
}

/// Validates a handle against the loaded scenario; `None` means NVML_ERROR_INVALID_ARGUMENT.
pub fn decode(handle: NvmlDevice, scenario: &Scenario) -> Option<Dev> {
    let bits = handle as usize;
    if bits & TAG_MASK != TAG {
        return None;
    }
    let g = (bits >> 16) & 0xFFFF;
    let gpu = scenario.gpus.get(g)?;
    match bits & KIND_MASK {
        KIND_GPU if bits & 0xFFFF == 0 => Some(Dev::Gpu(g)),
        KIND_MIG if gpu.mig_mode => {
            let m = gpu.mig_at_slot((bits & 0xFFFF) as u32)?;
            Some(Dev::Mig(g, m))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let s = Scenario::parse(
            "[[gpu]]\nmemory_total = 1\n[[gpu]]\nmemory_total = 1\nmig_mode = true\n[[gpu.mig]]\nindex = 3\nmemory_total = 1\ngpu_instance_id = 1\n",
        )
        .unwrap();
        for d in [Dev::Gpu(0), Dev::Gpu(1), Dev::Mig(1, 0)] {
            assert_eq!(decode(encode(d, &s), &s), Some(d));
        }
        assert_eq!(decode(std::ptr::null_mut(), &s), None);
        assert_eq!(decode(encode(Dev::Gpu(2), &s), &s), None);
        assert_eq!(decode(encode(Dev::Mig(0, 0), &s), &s), None);
        assert_eq!(decode(0x1234 as NvmlDevice, &s), None);
    }
}
