//! One NVML collection against the fake library, at 8 GPUs x 128 processes and 16 x 512, next to
//! the floor: the same NVML functions called bare through the C ABI (the symbols nvml-wrapper
//! loaded, into buffers allocated once), so `gpumon collect / bare C calls` prints in one run.
//! nvml-wrapper's own calls are a third line: what the safe wrapper adds on top of the floor.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::path::Path;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpumon::sources::nvml::NvmlSource;
use gpumon::sources::GpuSource;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;

/// A scenario of `gpus` H100s with `procs` processes each, written to `dir`.
fn scenario(dir: &Path, gpus: u32, procs: u32) -> std::path::PathBuf {
    let mut s = String::from("driver_version = \"550.54.15\"\n");
    for g in 0..gpus {
        s += "[[gpu]]\nmemory_total = 85520809984\nmemory_reserved = 567279616\nutilization_gpu = 80\ntemperature = 50\npower_usage_mw = 500000\npower_limit_mw = 700000\n";
        s += &format!(
            "[[gpu.process_group]]\ncount = {procs}\npid_base = {}\nused = 268435456\nused_step = 1048576\n",
            10_000 * (g + 1)
        );
    }
    let path = dir.join(format!("s{gpus}x{procs}.toml"));
    std::fs::write(&path, s).unwrap();
    path
}

/// The calls one collection makes per GPU, bare: handle, memory (v2), utilization,
/// temperature, power, MIG mode, and both process lists (count, then fill), as nvml-wrapper
/// makes them. Returns the processes listed.
fn bare_calls(lib: &NvmlLib, buf: &mut [nvmlProcessInfo_t]) -> usize {
    let mut listed = 0;
    // SAFETY: every pointer passed is to a live local or to `buf` with its true length, and
    // the symbols were resolved from the library nvml-wrapper initialised.
    unsafe {
        let mut count = 0;
        assert_eq!((lib.nvmlDeviceGetCount_v2.as_ref().unwrap())(&mut count), 0);
        for i in 0..count {
            let mut dev = MaybeUninit::<nvmlDevice_t>::zeroed().assume_init();
            (lib.nvmlDeviceGetHandleByIndex_v2.as_ref().unwrap())(i, &mut dev);
            let mut mem = MaybeUninit::<nvmlMemory_v2_t>::zeroed().assume_init();
            mem.version = (std::mem::size_of::<nvmlMemory_v2_t>() | (2 << 24)) as u32;
            (lib.nvmlDeviceGetMemoryInfo_v2.as_ref().unwrap())(dev, &mut mem);
            let mut util = MaybeUninit::<nvmlUtilization_t>::zeroed().assume_init();
            (lib.nvmlDeviceGetUtilizationRates.as_ref().unwrap())(dev, &mut util);
            let mut temp = 0;
            (lib.nvmlDeviceGetTemperature.as_ref().unwrap())(dev, 0, &mut temp);
            let mut power = 0;
            (lib.nvmlDeviceGetPowerUsage.as_ref().unwrap())(dev, &mut power);
            let (mut cur, mut pend) = (0, 0);
            (lib.nvmlDeviceGetMigMode.as_ref().unwrap())(dev, &mut cur, &mut pend);
            for list in [
                lib.nvmlDeviceGetComputeRunningProcesses_v3
                    .as_ref()
                    .unwrap(),
                lib.nvmlDeviceGetGraphicsRunningProcesses_v3
                    .as_ref()
                    .unwrap(),
            ] {
                let mut n = 0;
                list(dev, &mut n, std::ptr::null_mut());
                if n > 0 {
                    let mut n = buf.len() as u32;
                    assert_eq!(list(dev, &mut n, buf.as_mut_ptr()), 0);
                    listed += n as usize;
                }
            }
        }
    }
    listed
}

fn bench(c: &mut Criterion) {
    let lib = fake_nvml::harness::library_path();
    let lib = lib.to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    // Pinned time: every iteration sees the same node.
    std::env::set_var("FAKE_NVML_TIME", "10");
    let mut g = c.benchmark_group("collect");
    for (gpus, procs) in [(8u32, 128u32), (16, 512)] {
        let label = format!("{gpus}x{procs}");
        // SAFETY (edition 2021: set_var is safe): the fake library reads it at the next init,
        // and no other thread runs here.
        std::env::set_var("FAKE_NVML_SCENARIO", scenario(dir.path(), gpus, procs));
        let nvml = Nvml::builder().lib_path(OsStr::new(&lib)).init().unwrap();
        let mut source = NvmlSource::new(lib.clone(), dir.path().into());
        let first = source.collect().unwrap();
        assert_eq!(first.processes.len(), (gpus * procs) as usize);
        g.bench_function(BenchmarkId::new("gpumon_collect", &label), |b| {
            b.iter(|| source.collect().unwrap())
        });
        let mut buf = vec![unsafe { std::mem::zeroed::<nvmlProcessInfo_t>() }; 1024];
        assert_eq!(bare_calls(nvml.lib(), &mut buf), (gpus * procs) as usize);
        g.bench_function(BenchmarkId::new("bare_c_calls", &label), |b| {
            b.iter(|| bare_calls(nvml.lib(), &mut buf))
        });
        g.bench_function(BenchmarkId::new("nvml_wrapper_calls", &label), |b| {
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
        // Both handles shut down here, so the next scenario is loaded at the next init.
        drop(source);
        drop(nvml);
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
