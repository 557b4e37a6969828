//! The exported NVML C ABI, split by area. Every export runs its body under [`guard`], so no
//! panic unwinds into C; exports never call each other, so symbol interposition cannot reroute
//! an internal call.

// The exports are `extern "C"` entry points whose safety contract is nvml.h: callers pass valid
// pointers or NULL, and NULL is checked here.
#![allow(clippy::missing_safety_doc)]

pub mod device;
pub mod init;
pub mod memory;
pub mod mig;
pub mod processes;
pub mod system;
pub mod types;

use crate::handle::{self, Dev, NvmlDevice};
use crate::readings;
use crate::ret::{self, Ret};
use crate::scenario::{Call, Gpu, Scenario};
use crate::state::{self, Loaded};
use std::ffi::{c_char, c_uint};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Runs an export's body; a panic becomes NVML_ERROR_UNKNOWN instead of undefined behaviour.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ret::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => ret::UNKNOWN,
    }
}

/// An initialized library at one instant: every reading within a call uses the same `t`.
pub(crate) struct Ctx {
    pub loaded: Arc<Loaded>,
    pub t: f64,
}

impl Ctx {
    pub fn now() -> Result<Ctx, Ret> {
        let loaded = state::current()?;
        let t = loaded.clock.now();
        Ok(Ctx { loaded, t })
    }

    pub fn scenario(&self) -> &Scenario {
        &self.loaded.scenario
    }

    pub fn gpu(&self, dev: Dev) -> Result<&Gpu, Ret> {
        self.scenario()
            .gpus
            .get(dev.gpu())
            .ok_or(ret::INVALID_ARGUMENT)
    }

    pub fn fault(&self, g: usize, call: Call) -> Result<(), Ret> {
        match self
            .scenario()
            .gpus
            .get(g)
            .and_then(|gpu| readings::fault(gpu, call, self.t))
        {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }
}

/// The common shape of a per-device export: initialized, valid handle, no injected fault for
/// `call` on the (parent) GPU, then the body.
pub(crate) fn device_call(
    handle: NvmlDevice,
    call: Call,
    f: impl FnOnce(&Ctx, Dev, &Gpu) -> Result<(), Ret>,
) -> Ret {
    guard(|| {
        let ctx = Ctx::now()?;
        let dev = handle::decode(handle, ctx.scenario()).ok_or(ret::INVALID_ARGUMENT)?;
        ctx.fault(dev.gpu(), call)?;
        let gpu = ctx.gpu(dev)?;
        f(&ctx, dev, gpu)
    })
}

/// Only physical GPUs answer this call; MIG handles get NOT_SUPPORTED.
pub(crate) fn physical(dev: Dev) -> Result<usize, Ret> {
    match dev {
        Dev::Gpu(g) => Ok(g),
        Dev::Mig(..) => Err(ret::NOT_SUPPORTED),
    }
}

/// Writes `v` through a caller's out-pointer.
pub(crate) unsafe fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    if p.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and nvml.h makes the caller pass a writable T. `write_unaligned` because a
    // C caller's buffer need not meet Rust's alignment for T.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Copies `s` and a NUL into a caller's buffer of `len` bytes; INSUFFICIENT_SIZE if it does not
/// fit, as the real library does for fixed strings.
pub(crate) unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() >= len as usize {
        return Err(ret::INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller promises `len` writable bytes at `buf`, and bytes.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Reads a NUL-terminated C string argument.
pub(crate) unsafe fn get_str<'a>(p: *const c_char) -> Result<&'a str, Ret> {
    if p.is_null() {
        return Err(ret::INVALID_ARGUMENT);
    }
    // SAFETY: nvml.h string arguments are NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| ret::INVALID_ARGUMENT)
}
