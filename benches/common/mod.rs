//! What the benches share: a synthetic node reading.

use gpumon::core::model::*;

/// `gpus` H100s, each with `procs_per_gpu` compute processes (pids from 100,000 + 1,000 x GPU).
pub fn node(gpus: u32, procs_per_gpu: u32) -> NodeReading {
    let gpus_v = (0..gpus)
        .map(|index| GpuReading {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-{index:08x}-1111-2222-3333-444444444444"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x17 + index),
            },
            state: GpuState::Ok,
            error: None,
            memory: Some(MemoryInfo {
                total: 85_520_809_984,
                used: 40_000_000_000,
                free: 44_953_530_368,
                reserved: 567_279_616,
            }),
            utilization: Some(0.87),
            temperature_celsius: Some(61.0),
            power_watts: Some(512.3),
            mig_mode: false,
            mig_devices: vec![],
            unified: None,
        })
        .collect();
    let processes = (0..gpus)
        .flat_map(|g| {
            (0..procs_per_gpu).map(move |i| ProcessReading {
                gpu: g,
                uuid: format!("GPU-{g:08x}-1111-2222-3333-444444444444").into(),
                pid: 100_000 + g * 1000 + i,
                kind: ProcessKind::Compute,
                used_memory_bytes: Some(300_000_000 + i as u64),
                mig_uuid: None,
                gpu_instance_id: None,
                compute_instance_id: None,
                info: ProcInfo {
                    name: Some("python3".into()),
                    user: Some("trainer".into()),
                    uid: Some(1000),
                    container: Some("3f4e1b2c9d8a".into()),
                    cgroup: None,
                    ..ProcInfo::default()
                }
                .into(),
            })
        })
        .collect();
    NodeReading {
        ts: 1.0,
        driver_version: Some("550.54.15".into()),
        gpus: gpus_v,
        processes,
    }
}
