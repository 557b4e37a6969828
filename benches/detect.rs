//! Detection cost: one sample through the session store and every detector, with 1,000 live
//! sessions (the load is 1,000 sessions × 10 samples/s on one core).

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::core::jobs::Jobs;
use gpumon::core::store::sessions::{SessionLimits, Sessions};
use gpumon::core::trainer::Peer;
use gpumon::core::trainer::{Hello, Sample, Stats};

const GIB: u64 = 1 << 30;

fn sample(step: u64, leak: bool) -> Sample {
    let floor = 20 * GIB + (step * 7919 % 61) * (1 << 20) + if leak { step << 21 } else { 0 };
    Sample {
        ts: 1_763_700_000.0 + step as f64 * 0.1,
        step: Some(step),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(floor),
            allocated_peak: Some(floor + 10 * GIB),
            reserved: Some(floor + 12 * GIB),
            alloc_retries: Some(0),
            ooms: Some(0),
            ..Stats::default()
        },
        device_free: Some(20 * GIB),
        device_total: Some(80 * GIB),
        alloc_limit: None,
        categories: None,
    }
}

fn bench(c: &mut Criterion) {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let mut keys = Vec::new();
    for i in 0..1000u32 {
        let hello = Hello {
            v: 1,
            ns_pid: Some(u64::from(i)),
            job: Some(format!("job{i}")),
            rank: Some(0),
            cuda_device: Some(0),
            gpu_uuid: Some("GPU-1".into()),
            ..Hello::default()
        };
        let peer = Peer {
            pid: 1000 + i,
            uid: 0,
            gid: 0,
        };
        let (key, _) = s.open(&mut jobs, peer, hello, 0.0);
        keys.push(key);
    }
    // Warm every session past warm-up into steady state; one in ten leaks.
    for step in 0..3000u64 {
        for (i, k) in keys.iter().enumerate() {
            s.sample(*k, sample(step, i % 10 == 0), 0.0);
        }
    }
    let mut step = 3000u64;
    let mut i = 0usize;
    c.bench_function("detect/sample_1000_sessions", |b| {
        b.iter(|| {
            s.sample(keys[i], sample(step, i % 10 == 0), 0.0);
            i += 1;
            if i == keys.len() {
                i = 0;
                step += 1;
            }
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
