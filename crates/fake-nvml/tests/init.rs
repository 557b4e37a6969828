//! Library lifecycle: before init, no scenario, bad scenario, init_error, ref-counting.
//! One test function, because each step changes the process environment.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use fake_nvml::harness;
use nvml_wrapper::error::NvmlError;
use std::ffi::c_uint;

#[test]
fn lifecycle() {
    let count: unsafe extern "C" fn(*mut c_uint) -> u32 = sym("nvmlDeviceGetCount_v2");
    let init: unsafe extern "C" fn() -> u32 = sym("nvmlInit_v2");
    let init_flags: unsafe extern "C" fn(c_uint) -> u32 = sym("nvmlInitWithFlags");
    let shutdown: unsafe extern "C" fn() -> u32 = sym("nvmlShutdown");
    let mut n: c_uint = 0;

    // Before any init.
    assert_eq!(unsafe { count(&mut n) }, 1, "UNINITIALIZED before init");
    assert_eq!(unsafe { shutdown() }, 1, "shutdown without init");

    // No scenario: the driver is "not loaded".
    set_env(None, None);
    assert!(matches!(common::init(), Err(NvmlError::DriverNotLoaded)));
    assert_eq!(unsafe { init_flags(0) }, 9);

    // A scenario that does not parse fails init (NVML_ERROR_UNKNOWN; the reason goes to stderr).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("init-test");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[[gpu]]\nmemory_totl = 5\n").unwrap();
    set_env(Some(&bad), None);
    assert!(matches!(common::init(), Err(NvmlError::Unknown)));
    set_env(Some(&dir.join("missing.toml")), None);
    assert!(matches!(common::init(), Err(NvmlError::Unknown)));

    // init_error makes every init fail with that error.
    let denied = dir.join("denied.toml");
    std::fs::write(
        &denied,
        "init_error = \"no_permission\"\n[[gpu]]\nmemory_total = 5\n",
    )
    .unwrap();
    set_env(Some(&denied), None);
    assert!(matches!(common::init(), Err(NvmlError::NoPermission)));

    // A bad FAKE_NVML_TIME is reported, not ignored.
    set_env(Some(&harness::scenario_path("two_gpus")), None);
    std::env::set_var(fake_nvml::ENV_TIME, "soon");
    assert_eq!(unsafe { init() }, 999);

    // Ref-counting: two inits need two shutdowns.
    set_env(Some(&harness::scenario_path("two_gpus")), Some(0.0));
    assert_eq!(unsafe { init() }, 0);
    assert_eq!(unsafe { init_flags(0) }, 0);
    assert_eq!(unsafe { shutdown() }, 0);
    assert_eq!(
        unsafe { count(&mut n) },
        0,
        "still initialized after one of two shutdowns"
    );
    assert_eq!(n, 2);
    assert_eq!(unsafe { shutdown() }, 0);
    assert_eq!(
        unsafe { count(&mut n) },
        1,
        "uninitialized after the last shutdown"
    );

    // The scenario is re-read on the next init.
    set_env(Some(&harness::scenario_path("eight_gpus")), Some(0.0));
    let nvml = common::init().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 8);
    drop(nvml);
    assert_eq!(
        unsafe { count(&mut n) },
        1,
        "nvml-wrapper's drop shut the library down"
    );
}
