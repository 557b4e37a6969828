use super::*;
use crate::core::model::*;

fn gpu(index: u32, used: u64) -> GpuReading {
    GpuReading {
        identity: GpuIdentity {
            index,
            uuid: format!("GPU-{index}"),
            name: "Test GPU".into(),
            pci_bus_id: format!("00000000:{index:02x}:00.0"),
        },
        state: GpuState::Ok,
        error: None,
        memory: Some(MemoryInfo {
            total: 100,
            used,
            free: 100 - used,
            reserved: 0,
        }),
        utilization: None,
        temperature_celsius: None,
        power_watts: None,
        mig_mode: false,
        mig_devices: vec![],
        unified: None,
    }
}

fn process(gpu: u32, pid: u32, used: Option<u64>) -> ProcessReading {
    ProcessReading {
        gpu,
        uuid: format!("GPU-{gpu}").into(),
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: used,
        mig_uuid: None,
        gpu_instance_id: None,
        compute_instance_id: None,
        info: Default::default(),
    }
}

fn store() -> Store {
    Store::new(HistoryLimits { gpu_points: 10 }, 1.0, "lib".into())
}

#[test]
fn process_churn_keeps_only_the_gpus_series_and_the_latest_processes() {
    let mut s = store();
    // 10,000 collections, each with 50 fresh pids: only the live ones may remain.
    for round in 0..10_000u32 {
        let procs = (0..50)
            .map(|i| process(0, round * 50 + i, Some(1)))
            .collect();
        s.apply(
            NodeReading {
                ts: round as f64,
                driver_version: None,
                gpus: vec![gpu(0, 10)],
                processes: procs,
            },
            0.001,
        );
    }
    assert_eq!(s.gpu_series_count(), 1);
    assert_eq!(s.latest().map(|r| r.processes.len()), Some(50));
    assert_eq!(s.gpu_series("GPU-0").map(|g| g.len()), Some(10));
}

#[test]
fn ended_processes_and_gpus_disappear_at_next_collection() {
    let mut s = store();
    let mk = |gpus, processes| NodeReading {
        ts: 1.0,
        driver_version: None,
        gpus,
        processes,
    };
    s.apply(
        mk(vec![gpu(0, 1), gpu(1, 1)], vec![process(0, 7, Some(3))]),
        0.0,
    );
    assert_eq!(s.latest().map(|r| r.processes.len()), Some(1));
    s.apply(mk(vec![gpu(0, 1)], vec![]), 0.0);
    assert_eq!(s.latest().map(|r| r.processes.len()), Some(0));
    assert!(s.gpu_series("GPU-1").is_none());
}

#[test]
fn not_available_memory_stays_missing_in_the_stored_reading() {
    let mut s = store();
    s.apply(
        NodeReading {
            ts: 1.0,
            driver_version: None,
            gpus: vec![gpu(0, 1)],
            processes: vec![process(0, 9, None)],
        },
        0.0,
    );
    let p = s.latest().map(|r| r.processes[0].used_memory_bytes);
    assert_eq!(p, Some(None));
}

#[test]
fn failure_marks_nvml_down_and_drops_stale_reading() {
    let mut s = store();
    s.apply(
        NodeReading {
            ts: 1.0,
            driver_version: None,
            gpus: vec![gpu(0, 1)],
            processes: vec![process(0, 1, Some(1))],
        },
        0.0,
    );
    s.apply_failure(2.0, "library missing".into(), 0.0);
    assert!(!s.nvml.up);
    assert!(s.latest().is_none());
    assert_eq!(s.gpu_series_count(), 1);
    assert_eq!(s.nvml.poll_errors_total, 1);
}
