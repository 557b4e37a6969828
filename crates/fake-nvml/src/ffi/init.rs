//! nvmlInit*, nvmlShutdown, nvmlErrorString.

use super::guard;
use crate::ret::{self, Ret};
use crate::state;
use std::ffi::{c_char, c_uint};
use std::panic::catch_unwind;

fn init() -> Ret {
    guard(|| match state::init() {
        ret::SUCCESS => Ok(()),
        code => Err(code),
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    init()
}

/// The pre-v2 entry point; same behaviour here.
#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    init()
}

/// Flags (NO_GPUS, NO_ATTACH) change nothing for a fake: there is nothing to attach to.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    init()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    guard(|| match state::shutdown() {
        ret::SUCCESS => Ok(()),
        code => Err(code),
    })
}

/// Works without init, like the real one. Returns a static string.
#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    catch_unwind(|| ret::error_string(result).as_ptr()).unwrap_or(c"Unknown Error".as_ptr())
}
