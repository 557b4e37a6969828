//! The ingest hot path per sample line: parsing (outside the store lock) and applying it to a
//! session whose history ring is full (under the lock). Lines as the Python client sends them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use gpumon::core::apply::Core;
use gpumon::core::store::sessions::{SessionLimits, Sessions};
use gpumon::core::trainer::Peer;
use gpumon::sources::ingest::conn::Conn;
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

    let mut sessions = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut conn = Conn::new(Peer {
        pid: 1,
        uid: 0,
        gid: 0,
    });
    conn.handle(hello.as_bytes(), &mut sessions, 1e9);
    for _ in 0..4000 {
        conn.handle(sample.as_bytes(), &mut sessions, 1e9);
    }
    let Message::Sample(parsed) = parse(sample.as_bytes()).unwrap() else {
        panic!("the fixture's second line is a sample")
    };
    c.bench_function("apply one sample to a full session", |b| {
        b.iter(|| {
            conn.apply(
                Message::Sample(parsed.clone()),
                sample.as_bytes(),
                None,
                &mut sessions,
                1e9,
            )
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
