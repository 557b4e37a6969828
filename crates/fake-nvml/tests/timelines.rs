//! Scenario time: ramps, churn, a GPU falling off the bus, and fault windows, each checked at
//! pinned times (FAKE_NVML_TIME). One test function, because each step re-initializes with a
//! different environment.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

fn used_by(n: &nvml_wrapper::Nvml, pid: u32) -> Option<u64> {
    let d = n.device_by_index(0).unwrap();
    d.running_compute_processes()
        .unwrap()
        .into_iter()
        .find(|p| p.pid == pid)
        .map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => b,
            UsedGpuMemory::Unavailable => panic!("pid {pid}: n/a"),
        })
}

fn ramp() {
    for (t, leaky, stairs, visitor, extra) in [
        (0.0, GIB, 2 * GIB, None, 0),
        (10.0, 11 * GIB, 4 * GIB, None, 128 * MIB),
        (25.0, 26 * GIB, 6 * GIB, Some(4 * GIB), 320 * MIB),
        (39.0, 40 * GIB, 8 * GIB, None, 499 * MIB + 204 * 1024 + 819),
        (45.0, 41 * GIB, 2 * GIB, None, 512 * MIB),
    ] {
        let n = open("ramp", t);
        assert_eq!(used_by(&n, 9001), Some(leaky), "leaky at t={t}");
        assert_eq!(used_by(&n, 9002), Some(stairs), "stairs at t={t}");
        assert_eq!(used_by(&n, 9003), visitor, "visitor at t={t}");
        let m = n.device_by_index(0).unwrap().memory_info().unwrap();
        let expected = leaky + stairs + visitor.unwrap_or(0) + extra;
        assert!(
            m.used.abs_diff(expected) <= 1,
            "used at t={t}: {} vs {expected}",
            m.used
        );
    }
    let n = open("ramp", 20.0);
    let d = n.device_by_index(0).unwrap();
    assert_eq!(d.utilization_rates().unwrap().gpu, 50);
    assert_eq!(d.temperature(TemperatureSensor::Gpu).unwrap(), 55);
}

fn churn() {
    for t in [0.0, 1.0, 7.31, 100.0] {
        let n = open("churn", t);
        let d = n.device_by_index(0).unwrap();
        let p = d.running_compute_processes().unwrap();
        let short: Vec<u32> = p
            .iter()
            .map(|p| p.pid)
            .filter(|&pid| pid >= 200000)
            .collect();
        let expected = if t < 0.5 { (t * 50.0) as usize + 1 } else { 25 };
        assert_eq!(short.len(), expected, "churn processes at t={t}");
        assert!(
            short.windows(2).all(|w| w[1] == w[0] + 1),
            "consecutive pids"
        );
        assert_eq!(
            *short.last().unwrap(),
            200000 + (t * 50.0).floor() as u32,
            "newest pid at t={t}"
        );
        assert_eq!(
            d.memory_info().unwrap().used,
            10 * GIB + short.len() as u64 * MIB
        );
        assert_eq!(n.sys_process_name(short[0], 64).unwrap(), "short_job");
    }
}

fn gpu_lost() {
    let n = open("gpu_lost", 1.5);
    assert_eq!(
        n.device_by_index(1).unwrap().memory_info().unwrap().used,
        8 * GIB
    );
    drop(n);

    let n = open("gpu_lost", 2.0);
    assert_eq!(n.device_count().unwrap(), 2, "a lost GPU is still counted");
    assert!(matches!(n.device_by_index(1), Err(NvmlError::GpuLost)));
    assert!(matches!(
        n.device_by_uuid("GPU-fa4e0000-0000-4000-8000-000000000001"),
        Err(NvmlError::GpuLost)
    ));
    assert_eq!(
        n.device_by_index(0).unwrap().memory_info().unwrap().used,
        4 * GIB
    );
    drop(n);

    // A handle taken before the loss fails every call after it.
    let n = open("gpu_lost", 1.0);
    let h = handle(&n.device_by_index(1).unwrap());
    drop(n);
    let n = open("gpu_lost", 3.0);
    let name: unsafe extern "C" fn(Handle, *mut std::ffi::c_char, u32) -> u32 =
        sym("nvmlDeviceGetName");
    let mut buf = [0; 96];
    assert_eq!(unsafe { name(h, buf.as_mut_ptr(), 96) }, 15);
    drop(n);
}

fn fault_windows() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("timelines");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("faults.toml");
    std::fs::write(
        &path,
        r#"
[[gpu]]
memory_total = 1000000
temperature = 40
power_usage_mw = 1000
[[gpu.process]]
pid = 1
used = 10
[[gpu.fault]]
call = "memory"
error = "unknown"
from = 1.0
until = 2.0
[[gpu.fault]]
call = "processes"
error = "no_permission"
from = 5.0
[[gpu.fault]]
call = "temperature"
error = "not_supported"
until = 3.0
"#,
    )
    .unwrap();
    let at = |t: f64| {
        set_env(Some(&path), Some(t));
        init().unwrap()
    };
    for (t, mem_ok, procs_ok, temp_ok) in [
        (0.0, true, true, false),
        (1.0, false, true, false),
        (1.99, false, true, false),
        (2.0, true, true, false),
        (3.0, true, true, true),
        (5.0, true, false, true),
        (1e6, true, false, true),
    ] {
        let n = at(t);
        let d = n.device_by_index(0).unwrap();
        match d.memory_info() {
            Ok(m) => assert!(mem_ok && m.used == 10, "t={t}"),
            Err(e) => assert!(!mem_ok && matches!(e, NvmlError::Unknown), "t={t}: {e:?}"),
        }
        match d.running_compute_processes() {
            Ok(p) => assert!(procs_ok && p.len() == 1, "t={t}"),
            Err(e) => assert!(
                !procs_ok && matches!(e, NvmlError::NoPermission),
                "t={t}: {e:?}"
            ),
        }
        match d.temperature(TemperatureSensor::Gpu) {
            Ok(v) => assert!(temp_ok && v == 40, "t={t}"),
            Err(e) => assert!(
                !temp_ok && matches!(e, NvmlError::NotSupported),
                "t={t}: {e:?}"
            ),
        }
        assert_eq!(
            d.power_usage().unwrap(),
            1000,
            "unfaulted calls keep working at t={t}"
        );
    }
}

fn unpinned_time_moves() {
    // Without FAKE_NVML_TIME, time 0 is FAKE_NVML_T0: put it 30 s in the past.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    set_env(Some(&fake_nvml::harness::scenario_path("ramp")), None);
    std::env::set_var(fake_nvml::ENV_T0, (now - 30.0).to_string());
    let n = init().unwrap();
    let leaky = used_by(&n, 9001).unwrap();
    assert!(
        (31 * GIB..=33 * GIB).contains(&leaky),
        "leaky at t~30: {leaky}"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        used_by(&n, 9001).unwrap() > leaky,
        "memory keeps ramping between calls"
    );
    std::env::remove_var(fake_nvml::ENV_T0);
}

#[test]
fn scenario_time() {
    ramp();
    churn();
    gpu_lost();
    fault_windows();
    unpinned_time_moves();
}
