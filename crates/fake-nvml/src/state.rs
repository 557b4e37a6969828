//! Process-wide library state: the init reference count and the loaded scenario.

use crate::clock::Clock;
use crate::ret::{self, Ret};
use crate::scenario::Scenario;
use std::sync::{Arc, Mutex, MutexGuard};

pub const ENV_SCENARIO: &str = "FAKE_NVML_SCENARIO";

/// What an initialized library answers from. Shared by `Arc` so a call holds the global lock only
/// long enough to clone it.
#[derive(Debug)]
pub struct Loaded {
    pub scenario: Scenario,
    pub clock: Clock,
}

struct Global {
    /// `nvmlInit*` minus `nvmlShutdown` calls; like the real library, only the last shutdown
    /// uninitializes.
    refcount: u32,
    loaded: Option<Arc<Loaded>>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    refcount: 0,
    loaded: None,
});

/// Messages already printed, so a reader that retries init in a loop does not flood stderr.
static REPORTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock (caught at the FFI boundary) must not wedge every later
    // call; the guarded data stays consistent because every update is a single assignment.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub fn report_once(msg: &str) {
    let mut seen = lock(&REPORTED);
    if !seen.iter().any(|m| m == msg) {
        // One write, so the line does not interleave with the host program's own logging.
        let line = format!("fake-nvml: {msg}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        seen.push(msg.to_owned());
    }
}

/// Reads the environment and scenario. The scenario is re-read on every transition from
/// uninitialized to initialized, so a process can switch scenarios between init cycles.
fn load_from_env() -> Result<Loaded, Ret> {
    let Some(path) = std::env::var_os(ENV_SCENARIO) else {
        report_once(&format!(
            "{ENV_SCENARIO} is not set; nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED"
        ));
        return Err(ret::DRIVER_NOT_LOADED);
    };
    let scenario = Scenario::load(path.as_ref()).map_err(|e| {
        report_once(&e);
        ret::UNKNOWN
    })?;
    if let Some(e) = scenario.init_error {
        return Err(e.code());
    }
    let clock = Clock::from_env().map_err(|e| {
        report_once(&e);
        ret::UNKNOWN
    })?;
    Ok(Loaded { scenario, clock })
}

pub fn init() -> Ret {
    let mut g = lock(&GLOBAL);
    if g.refcount > 0 {
        g.refcount = g.refcount.saturating_add(1);
        return ret::SUCCESS;
    }
    match load_from_env() {
        Ok(loaded) => {
            g.loaded = Some(Arc::new(loaded));
            g.refcount = 1;
            ret::SUCCESS
        }
        Err(code) => code,
    }
}

pub fn shutdown() -> Ret {
    let mut g = lock(&GLOBAL);
    match g.refcount {
        0 => ret::UNINITIALIZED,
        1 => {
            g.refcount = 0;
            g.loaded = None;
            ret::SUCCESS
        }
        _ => {
            g.refcount -= 1;
            ret::SUCCESS
        }
    }
}

/// The loaded scenario, or NVML_ERROR_UNINITIALIZED.
pub fn current() -> Result<Arc<Loaded>, Ret> {
    lock(&GLOBAL).loaded.clone().ok_or(ret::UNINITIALIZED)
}
