//! Whether the NVML library loaded is crates/fake-nvml: it exports `fakeNvmlIdentity`, which no
//! real NVML has (a scenario may claim any driver version, so the version tells nothing). Its
//! GPUs and processes are a scenario's, and unless the scenario says its pids are this host's
//! (`host_pids`), a pid missing from /proc never ran here: orphaned memory is judged for
//! zombies only (detect/orphan.rs, `HostPids::Simulated`).

use std::ffi::{c_char, c_uint, CStr};

/// What the library says it is ("fake-nvml 0.1.0; pids: scenario"), None for a real NVML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fake {
    pub identity: String,
}

impl Fake {
    /// Whether the scenario's pids are meant as this host's.
    pub fn host_pids(&self) -> bool {
        self.identity.ends_with("pids: host")
    }
}

type Identity = unsafe extern "C" fn(*mut c_char, c_uint) -> c_uint;

/// Asks the library at `path` (already loaded and initialised by nvml-wrapper) what it is.
pub fn identify(path: &str) -> Option<Fake> {
    // SAFETY: loading the library nvml-wrapper already loaded returns the same handle (its
    // initialisers ran then). The symbol, when there, is fake-nvml's
    // `fakeNvmlIdentity(char *out, unsigned length) -> nvmlReturn_t`: it writes at most
    // `length` bytes, NUL included, into `out`, and never keeps the pointer.
    unsafe {
        let lib = libloading::Library::new(path).ok()?;
        let f = lib.get::<Identity>(b"fakeNvmlIdentity\0").ok()?;
        let mut buf = [0 as c_char; 128];
        let identity = if f(buf.as_mut_ptr(), buf.len() as c_uint) == 0 {
            CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
        } else {
            "fake-nvml (it did not say more)".to_string()
        };
        Some(Fake { identity })
    }
}
