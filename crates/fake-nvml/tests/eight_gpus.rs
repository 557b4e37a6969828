//! The 8-GPU scenarios: 16 and 128 processes per GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use nvml_wrapper::enums::device::UsedGpuMemory;

const TOTAL: u64 = 85520809984;
const RESERVED: u64 = 567279616;

fn check(name: &str, per_gpu: u32, base_used: u64, step: u64) {
    let n = open(name, 0.0);
    assert_eq!(n.device_count().unwrap(), 8);
    let expected_sum: u64 = (0..u64::from(per_gpu)).map(|k| base_used + k * step).sum();
    for g in 0..8u32 {
        let d = n.device_by_index(g).unwrap();
        let p = d.running_compute_processes().unwrap();
        assert_eq!(p.len(), per_gpu as usize, "{name} gpu {g}");
        for (k, proc_) in p.iter().enumerate() {
            assert_eq!(proc_.pid, 10000 * (g + 1) + k as u32);
            assert_eq!(
                proc_.used_gpu_memory,
                UsedGpuMemory::Used(base_used + k as u64 * step)
            );
        }
        let m = d.memory_info().unwrap();
        assert_eq!(
            (m.total, m.reserved, m.used),
            (TOTAL, RESERVED, expected_sum),
            "{name} gpu {g}"
        );
        assert_eq!(d.utilization_rates().unwrap().gpu, 80 + g);
        assert_eq!(
            d.uuid().unwrap(),
            format!("GPU-fa4e0000-0000-4000-8000-{g:012x}")
        );
        assert_eq!(d.pci_info().unwrap().bus, 0x10 * (g + 1));
    }
}

#[test]
fn eight_gpus_16_and_128_processes() {
    check("eight_gpus", 16, GIB, 64 * MIB);
    check("eight_gpus_128", 128, 256 * MIB, MIB);
    // The sums the scenario files' comments promise.
    assert_eq!(
        (0..16u64).map(|k| GIB + k * 64 * MIB).sum::<u64>(),
        25232932864
    );
    assert_eq!(
        (0..128u64).map(|k| 256 * MIB + k * MIB).sum::<u64>(),
        42882564096
    );
}
