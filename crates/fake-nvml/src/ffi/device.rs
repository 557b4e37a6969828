//! Device enumeration, identity and sensors.

use super::types::{PciInfo, Utilization};
use super::{device_call, get_str, guard, physical, put, put_str, Ctx};
use crate::handle::{self, Dev, NvmlDevice};
use crate::readings;
use crate::ret::{self, Ret};
use crate::scenario::{parse_bus_id, Call, Clocks};
use crate::value::{to_u32, Value};
use std::ffi::{c_char, c_uint};

fn count(out: *mut c_uint) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        unsafe { put(out, ctx.scenario().gpus.len() as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> Ret {
    count(device_count)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(device_count: *mut c_uint) -> Ret {
    count(device_count)
}

fn handle_by_index(index: c_uint, out: *mut NvmlDevice) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        let g = index as usize;
        if g >= ctx.scenario().gpus.len() {
            return Err(ret::INVALID_ARGUMENT);
        }
        ctx.fault(g, Call::Handle)?;
        unsafe { put(out, handle::encode(Dev::Gpu(g), ctx.scenario())) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> Ret {
    handle_by_index(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut NvmlDevice) -> Ret {
    handle_by_index(index, device)
}

/// Finds a GPU, or a MIG device of a GPU in MIG mode, by UUID.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        let wanted = unsafe { get_str(uuid) }?;
        let s = ctx.scenario();
        let found = s.gpus.iter().enumerate().find_map(|(g, gpu)| {
            if readings::gpu_uuid(s, g) == wanted {
                return Some(Dev::Gpu(g));
            }
            let migs = if gpu.mig_mode { gpu.migs.len() } else { 0 };
            (0..migs)
                .find(|&m| readings::mig_uuid(s, g, m) == wanted)
                .map(|m| Dev::Mig(g, m))
        });
        let dev = found.ok_or(ret::NOT_FOUND)?;
        ctx.fault(dev.gpu(), Call::Handle)?;
        unsafe { put(device, handle::encode(dev, s)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        let wanted = parse_bus_id(unsafe { get_str(pci_bus_id) }?).ok_or(ret::INVALID_ARGUMENT)?;
        let s = ctx.scenario();
        let g = (0..s.gpus.len())
            .find(|&g| parse_bus_id(&readings::pci_bus_id(s, g)) == Some(wanted))
            .ok_or(ret::NOT_FOUND)?;
        ctx.fault(g, Call::Handle)?;
        unsafe { put(device, handle::encode(Dev::Gpu(g), s)) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> Ret {
    device_call(device, Call::Index, |_, dev, _| {
        let g = physical(dev)?;
        unsafe { put(index, g as c_uint) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    device_call(device, Call::Uuid, |ctx, dev, _| {
        let s = match dev {
            Dev::Gpu(g) => readings::gpu_uuid(ctx.scenario(), g),
            Dev::Mig(g, m) => readings::mig_uuid(ctx.scenario(), g, m),
        };
        unsafe { put_str(uuid, length, &s) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    device_call(device, Call::Name, |_, dev, gpu| {
        let s = match dev {
            Dev::Gpu(_) => gpu.name.clone(),
            Dev::Mig(_, m) => readings::mig_name(gpu, m),
        };
        unsafe { put_str(name, length, &s) }
    })
}

fn c_chars<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    out
}

fn pci_info(device: NvmlDevice, out: *mut PciInfo) -> Ret {
    device_call(device, Call::Pci, |ctx, dev, gpu| {
        let g = physical(dev)?;
        let id = readings::pci_bus_id(ctx.scenario(), g);
        // Validated at load; a default id always parses.
        let (domain, bus, device, function) = parse_bus_id(&id).ok_or(ret::UNKNOWN)?;
        let info = PciInfo {
            bus_id_legacy: c_chars(&format!(
                "{:04X}:{bus:02X}:{device:02X}.{function:X}",
                domain & 0xFFFF
            )),
            domain,
            bus,
            device,
            pci_device_id: gpu.pci_device_id,
            pci_sub_system_id: gpu.pci_sub_system_id,
            bus_id: c_chars(&format!("{domain:08X}:{bus:02X}:{device:02X}.{function:X}")),
        };
        unsafe { put(out, info) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: NvmlDevice, pci: *mut PciInfo) -> Ret {
    pci_info(device, pci)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(device: NvmlDevice, pci: *mut PciInfo) -> Ret {
    pci_info(device, pci)
}

/// A scenario reading that is NOT_SUPPORTED when omitted.
fn reading(v: Option<&Value>, t: f64) -> Result<u32, Ret> {
    v.and_then(|v| v.at(t))
        .map(to_u32)
        .ok_or(ret::NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    utilization: *mut Utilization,
) -> Ret {
    device_call(device, Call::Utilization, |ctx, dev, gpu| {
        physical(dev)?;
        let u = Utilization {
            gpu: reading(gpu.utilization_gpu.as_ref(), ctx.t)?,
            memory: reading(gpu.utilization_memory.as_ref(), ctx.t).unwrap_or(0),
        };
        unsafe { put(utilization, u) }
    })
}

/// Typical NVML sampling period for encoder/decoder utilization, in microseconds.
const SAMPLING_PERIOD_US: c_uint = 167_000;

fn codec_utilization(
    device: NvmlDevice,
    pick: fn(&crate::scenario::Gpu) -> Option<&Value>,
    util: *mut c_uint,
    period: *mut c_uint,
) -> Ret {
    device_call(device, Call::Utilization, |ctx, dev, gpu| {
        physical(dev)?;
        let u = reading(pick(gpu), ctx.t)?;
        if period.is_null() {
            return Err(ret::INVALID_ARGUMENT);
        }
        unsafe {
            put(util, u)?;
            put(period, SAMPLING_PERIOD_US)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: NvmlDevice,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> Ret {
    codec_utilization(
        device,
        |g| g.encoder_utilization.as_ref(),
        utilization,
        sampling_period_us,
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: NvmlDevice,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> Ret {
    codec_utilization(
        device,
        |g| g.decoder_utilization.as_ref(),
        utilization,
        sampling_period_us,
    )
}

/// `NVML_TEMPERATURE_GPU`, the only sensor nvml.h defines.
const TEMPERATURE_GPU: c_uint = 0;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: NvmlDevice,
    sensor_type: c_uint,
    temp: *mut c_uint,
) -> Ret {
    device_call(device, Call::Temperature, |ctx, dev, gpu| {
        physical(dev)?;
        if sensor_type != TEMPERATURE_GPU {
            return Err(ret::INVALID_ARGUMENT);
        }
        let v = reading(gpu.temperature.as_ref(), ctx.t)?;
        unsafe { put(temp, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: NvmlDevice, power: *mut c_uint) -> Ret {
    device_call(device, Call::Power, |ctx, dev, gpu| {
        physical(dev)?;
        let v = reading(gpu.power_usage_mw.as_ref(), ctx.t)?;
        unsafe { put(power, v) }
    })
}

fn power_limit(device: NvmlDevice, limit: *mut c_uint) -> Ret {
    device_call(device, Call::Power, |_, dev, gpu| {
        physical(dev)?;
        let v = gpu.power_limit_mw.ok_or(ret::NOT_SUPPORTED)?;
        unsafe { put(limit, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: NvmlDevice,
    limit: *mut c_uint,
) -> Ret {
    power_limit(device, limit)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: NvmlDevice,
    limit: *mut c_uint,
) -> Ret {
    power_limit(device, limit)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: NvmlDevice,
    default_limit: *mut c_uint,
) -> Ret {
    power_limit(device, default_limit)
}

/// A scenario with `fan_speed` has one fan; without it, the fan calls are NOT_SUPPORTED.
fn fan(device: NvmlDevice, fan: c_uint, speed: *mut c_uint) -> Ret {
    device_call(device, Call::Fan, |ctx, dev, gpu| {
        physical(dev)?;
        let v = reading(gpu.fan_speed.as_ref(), ctx.t)?;
        if fan != 0 {
            return Err(ret::INVALID_ARGUMENT);
        }
        unsafe { put(speed, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(device: NvmlDevice, speed: *mut c_uint) -> Ret {
    fan(device, 0, speed)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: NvmlDevice,
    fan_index: c_uint,
    speed: *mut c_uint,
) -> Ret {
    fan(device, fan_index, speed)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(device: NvmlDevice, num_fans: *mut c_uint) -> Ret {
    device_call(device, Call::Fan, |_, dev, gpu| {
        physical(dev)?;
        if gpu.fan_speed.is_none() {
            return Err(ret::NOT_SUPPORTED);
        }
        unsafe { put(num_fans, 1) }
    })
}

fn clock(
    device: NvmlDevice,
    pick: fn(&crate::scenario::Gpu) -> &Option<Clocks>,
    kind: c_uint,
    mhz: *mut c_uint,
) -> Ret {
    device_call(device, Call::Clocks, |ctx, dev, gpu| {
        physical(dev)?;
        // nvmlClockType_t: GRAPHICS 0, SM 1, MEM 2, VIDEO 3.
        let clocks = pick(gpu).as_ref();
        let v = match kind {
            0 => clocks.and_then(|c| c.graphics.as_ref()),
            1 => clocks.and_then(|c| c.sm.as_ref()),
            2 => clocks.and_then(|c| c.memory.as_ref()),
            3 => clocks.and_then(|c| c.video.as_ref()),
            _ => return Err(ret::INVALID_ARGUMENT),
        };
        let v = reading(v, ctx.t)?;
        unsafe { put(mhz, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: NvmlDevice,
    clock_type: c_uint,
    clock_mhz: *mut c_uint,
) -> Ret {
    clock(device, |g| &g.clock_mhz, clock_type, clock_mhz)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: NvmlDevice,
    clock_type: c_uint,
    clock_mhz: *mut c_uint,
) -> Ret {
    clock(device, |g| &g.max_clock_mhz, clock_type, clock_mhz)
}
