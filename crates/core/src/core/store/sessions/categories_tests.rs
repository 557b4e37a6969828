//! A trainer's split reaching the session, its near_limit and its OOM: the message says where
//! the memory went, the hint sizes each remedy.

use super::*;
use crate::core::categories::Categories;
use crate::core::detect::findings::{Finding, FindingState};
use crate::core::detect::Kind;

const GIB: u64 = 1 << 30;
const PEER: Peer = Peer {
    pid: 10,
    uid: 0,
    gid: 0,
};

fn split() -> Categories {
    crate::core::categories::example(Some(16), 4 * GIB)
}

/// Step `step` of a trainer under a 10 GiB cap whose step peaks at 9.6 GiB.
fn sample(ts: f64, step: u64, categories: Option<Categories>) -> Sample {
    Sample {
        ts,
        step: Some(step),
        phase: "train".into(),
        stats: Stats {
            allocated: Some(4 * GIB),
            allocated_peak: Some(9 * GIB + 600 * (1 << 20)),
            reserved: Some(9 * GIB + 700 * (1 << 20)),
            ..Stats::default()
        },
        device_free: Some(60 * GIB),
        device_total: Some(80 * GIB),
        alloc_limit: None,
        categories: categories.map(Box::new),
    }
}

fn open(s: &mut Sessions, jobs: &mut Jobs, t0: f64) -> u64 {
    let hello = Hello {
        v: 1,
        job: Some("ft".into()),
        rank: Some(3),
        world_size: Some(8),
        gpu_uuid: Some("GPU-a".into()),
        alloc_limit: Some(10 * GIB),
        ..Hello::default()
    };
    s.open(jobs, PEER, hello, t0).0
}

fn firing(s: &mut Sessions, kind: Kind) -> Option<Finding> {
    s.findings
        .drain()
        .into_iter()
        .rev()
        .find(|f| f.state == FindingState::Firing && f.kind == kind)
}

#[test]
fn near_limit_and_oom_say_where_the_memory_went_and_what_fits() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let t0 = 1_763_700_000.0;
    let key = open(&mut s, &mut jobs, t0);
    let mut near = None;
    for step in 1..=10 {
        let ts = t0 + step as f64;
        let c = (step == 3).then(split);
        s.sample(key, sample(ts, step, c), ts);
        near = near.or(firing(&mut s, Kind::NearLimit));
    }
    let near = near.expect("near_limit fired");
    let c = near.evidence.categories.as_deref().expect("the split");
    // Under the 10 GiB cap less a twentieth: (9.5 GiB − 4 GiB fixed) / (5.6 GiB / 16) = 15.7.
    assert_eq!(c.largest_safe_batch, Some(15));
    assert!(
        near.message.contains(
            "where the memory went: parameters 1.0 GiB, gradients 1.0 GiB, optimizer state 2.0 GiB, activations 4.0 GiB, other 1.6 GiB (step 3, batch 16)"
        ),
        "{}",
        near.message
    );
    let hint = near.hint.clone().unwrap_or_default();
    for part in [
        "a batch of 15 fits (now 16;",
        "activation checkpointing frees up to 4.0 GiB",
        "bf16 parameters and gradients free 1.0 GiB",
        "over the job's 8 ranks (ZeRO-1, FSDP) frees 1.8 GiB",
        "or raise torch.cuda.set_per_process_memory_fraction",
    ] {
        assert!(hint.contains(part), "{part:?} not in {hint}");
    }
    // The OOM event comes without a sample: the split and limit of the latest one stand.
    s.event(
        key,
        Event {
            ts: t0 + 11.0,
            kind: "oom".into(),
            alloc_bytes: Some(GIB),
            device_free: Some(60 * GIB),
            alloc_limit: Some(10 * GIB),
            phase: None,
            detail: None,
            path: None,
            dropped: None,
            explanation: None,
            ending: None,
        },
    );
    let oom = firing(&mut s, Kind::Oom).expect("oom fired");
    assert!(
        oom.message.contains("where the memory went: parameters"),
        "{}",
        oom.message
    );
    assert!(
        oom.hint
            .unwrap_or_default()
            .starts_with("a batch of 15 fits"),
        "the OOM's remedies are sized"
    );
    let view = s.live().next().expect("live");
    assert_eq!(view.categories.latest().map(|l| l.measured.step), Some(3));
}

#[test]
fn without_a_split_the_messages_are_as_before() {
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let t0 = 1_763_700_000.0;
    let key = open(&mut s, &mut jobs, t0);
    let mut near = None;
    for step in 1..=10 {
        let ts = t0 + step as f64;
        s.sample(key, sample(ts, step, None), ts);
        near = near.or(firing(&mut s, Kind::NearLimit));
    }
    let near = near.expect("near_limit fired");
    assert!(near.evidence.categories.is_none());
    assert!(!near.message.contains("where the memory went"));
    assert!(near
        .hint
        .unwrap_or_default()
        .starts_with("this process may use only part of the GPU"));
}
