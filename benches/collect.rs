//! One NVML collection cycle at 8 GPUs x 128 processes against the fake library, next to the
//! same NVML calls made bare: the difference is gpumon's own CPU per cycle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::sources::nvml::NvmlSource;
use gpumon::sources::GpuSource;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::Nvml;

fn setup() -> String {
    let lib = fake_nvml::harness::library_path();
    // SAFETY (edition 2021: set_var is safe): set before any thread reads the environment.
    std::env::set_var(
        "FAKE_NVML_SCENARIO",
        fake_nvml::harness::scenario_path("eight_gpus_128"),
    );
    // Pinned time: every iteration sees the same node.
    std::env::set_var("FAKE_NVML_TIME", "10");
    lib.to_string_lossy().into_owned()
}

fn bench(c: &mut Criterion) {
    let lib = setup();
    let mut source = NvmlSource::new(lib.clone(), "/proc".into());
    let first = source.collect().unwrap();
    assert_eq!(first.gpus.len(), 8);
    assert_eq!(first.processes.len(), 8 * 128);

    let mut g = c.benchmark_group("collect_8gpu_x_128proc");
    g.bench_function("gpumon_collect", |b| b.iter(|| source.collect().unwrap()));

    let nvml = Nvml::builder().lib_path(OsStr::new(&lib)).init().unwrap();
    g.bench_function("bare_nvml_calls", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for i in 0..nvml.device_count().unwrap() {
                let d = nvml.device_by_index(i).unwrap();
                let _ = d.memory_info();
                let _ = d.utilization_rates();
                let _ = d.temperature(TemperatureSensor::Gpu);
                let _ = d.power_usage();
                let _ = d.mig_mode();
                n += d.running_compute_processes().unwrap().len();
                n += d.running_graphics_processes().unwrap().len();
            }
            n
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
