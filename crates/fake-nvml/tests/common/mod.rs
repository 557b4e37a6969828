//! Shared helpers for the integration tests. Each test binary is its own process, so each can
//! point the library at its own scenario; within a binary, tests share the library's state.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use fake_nvml::harness;
use nvml_wrapper::Nvml;
use std::ffi::{c_uint, c_void};
use std::path::Path;
use std::sync::OnceLock;

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// The fake library opened with libloading, for raw C calls that nvml-wrapper does not expose.
/// It is the same loaded object nvml-wrapper uses, so it shares the init state.
pub fn raw() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(|| unsafe { libloading::Library::new(harness::library_path()) }.unwrap())
}

/// A raw export by name.
pub fn sym<T: Copy>(name: &str) -> T {
    unsafe { *raw().get::<T>(name.as_bytes()).unwrap() }
}

pub type Handle = *mut c_void;

pub fn handle(d: &nvml_wrapper::Device) -> Handle {
    unsafe { d.handle() }.cast()
}

/// Points the library at `scenario` (and pins time when `time` is set) for the next init.
/// Only call this while no other thread of the binary is initializing the library.
pub fn set_env(scenario: Option<&Path>, time: Option<f64>) {
    match scenario {
        Some(p) => std::env::set_var(fake_nvml::ENV_SCENARIO, p),
        None => std::env::remove_var(fake_nvml::ENV_SCENARIO),
    }
    match time {
        Some(t) => std::env::set_var(fake_nvml::ENV_TIME, t.to_string()),
        None => std::env::remove_var(fake_nvml::ENV_TIME),
    }
}

pub fn init() -> Result<Nvml, nvml_wrapper::error::NvmlError> {
    let lib = harness::library_path();
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

/// Opens a shipped scenario at a pinned time.
pub fn open(name: &str, time: f64) -> Nvml {
    set_env(Some(&harness::scenario_path(name)), Some(time));
    init().unwrap()
}

/// One `Nvml` shared by all tests of a binary, on one scenario at one pinned time.
pub fn shared(name: &'static str, time: f64) -> &'static Nvml {
    static NVML: OnceLock<Nvml> = OnceLock::new();
    NVML.get_or_init(|| open(name, time))
}

pub type ProcFn =
    unsafe extern "C" fn(Handle, *mut c_uint, *mut fake_nvml::ffi::types::ProcessInfo) -> u32;

/// The compute process list through the raw two-call pattern.
pub fn raw_compute_processes(h: Handle) -> Vec<fake_nvml::ffi::types::ProcessInfo> {
    let f: ProcFn = sym("nvmlDeviceGetComputeRunningProcesses_v3");
    let mut n: c_uint = 0;
    let r = unsafe { f(h, &mut n, std::ptr::null_mut()) };
    if r == 0 {
        return vec![];
    }
    assert_eq!(r, 7, "first call should be INSUFFICIENT_SIZE");
    let mut buf = vec![fake_nvml::ffi::types::ProcessInfo::default(); n as usize];
    assert_eq!(unsafe { f(h, &mut n, buf.as_mut_ptr()) }, 0);
    buf.truncate(n as usize);
    buf
}
