//! The ingest hot path per sample line: parsing (outside the store lock) and applying it to a
//! session whose history ring is full (under the lock). Lines as the Python client sends them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::core::apply::Core;
use gpumon::core::input::{Input, Lines, Link};
use gpumon::core::store::sessions::{SessionLimits, Sessions};
use gpumon::core::trainer::Peer;
use gpumon::sources::ingest::protocol::{parse, Message};

const FIXTURE: &str = include_str!("../tests/fixtures/protocol/client_session.jsonl");

fn bench(c: &mut Criterion) {
    let mut lines = FIXTURE.lines();
    let hello = lines.next().unwrap();
    let sample = lines.next().unwrap();
    c.bench_function("parse one sample line", |b| {
        b.iter(|| parse(std::hint::black_box(sample.as_bytes())).unwrap())
    });

    // The rare sample that carries the measured split (docs/categories.md).
    let split = format!(
        r#"{},"categories":{{"step":3,"parameters_bytes":4294967296,"gradients_bytes":4294967296,"optimizer_state_bytes":8589934592,"buffers_bytes":1048576,"activations_bytes":6442450944,"batch_size":16,"fp32_bytes":8589934592,"partial":["dtensor_local: 96 parameters are DTensor shards: local sizes counted"]}}}}"#,
        &sample[..sample.len() - 1]
    );
    let Message::Sample(with) = parse(split.as_bytes()).unwrap() else {
        panic!("a sample with categories")
    };
    assert!(with.categories.is_some());
    c.bench_function("parse one sample line with categories", |b| {
        b.iter(|| parse(std::hint::black_box(split.as_bytes())).unwrap())
    });

    let mut core = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut batch = Box::new(Lines::new(Link::new(Peer {
        pid: 1,
        uid: 0,
        gid: 0,
    })));
    batch.now = 1e9;
    // The hello and a full ring, each as the batch of parsed lines ingest hands the core.
    for line in std::iter::once(hello).chain(std::iter::repeat_n(sample, 4000)) {
        batch.messages.push(parse(line.as_bytes()).unwrap());
        batch.applied.clear();
        batch = core.apply(Input::Lines(batch)).into_lines().unwrap();
    }
    let Message::Sample(parsed) = parse(sample.as_bytes()).unwrap() else {
        panic!("the fixture's second line is a sample")
    };
    let mut batch = Some(batch);
    c.bench_function("apply one sample to a full session", |b| {
        b.iter(|| {
            let mut l = batch.take().unwrap();
            l.applied.clear();
            l.messages.push(Message::Sample(parsed.clone()));
            batch = Some(core.lines(l));
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
