#![allow(clippy::unwrap_used)]
use super::*;
use crate::core::detect::Kind;
use crate::core::jobs::verdict::{verdict, Basis, Rules};
use crate::core::jobs::{Failure, Member};

fn member(session: &str, rank: Option<u64>, crashed: bool) -> Member {
    Member {
        session: session.into(),
        rank,
        host: None,
        file: Some(format!("{session}.jsonl")),
        pid: 7,
        gpu_uuid: None,
        started: 0.0,
        ended: crashed.then_some(5.0),
        failure: crashed.then(|| Failure {
            kind: Kind::Crash,
            ts: 5.0,
            step: Some(3),
            message: "exited".into(),
            exception: None,
            signal: None,
        }),
        peak_bytes: None,
        headroom_bytes: None,
        oom_eta_seconds: None,
        findings: Vec::new(),
        stray: Vec::new(),
    }
}

fn report(members: Vec<Member>) -> String {
    let v = verdict(
        Basis {
            job: "train".into(),
            members,
            ..Basis::default()
        },
        &Rules::default(),
    );
    let mut out = String::new();
    jobs(&mut out, &[v]);
    out
}

#[test]
fn a_trace_without_a_rank_prints_no_empty_rank() {
    let out = report(vec![member("s-1", None, true)]);
    assert!(
        out.starts_with("job train: 1 trace, no rank: failed\n"),
        "{out}"
    );
    assert!(out.contains("first failure: session s-1 crash"), "{out}");
    assert!(!out.contains("ranks "), "{out}");
}

#[test]
fn ranks_are_named_and_one_trace_is_one() {
    let out = report(vec![
        member("s-0", Some(0), true),
        member("s-1", Some(1), false),
        member("s-2", Some(2), false),
    ]);
    assert!(
        out.starts_with("job train: 3 traces, ranks 0-2: failed\n"),
        "{out}"
    );
    let one = report(vec![member("s-4", Some(4), true)]);
    assert!(
        one.starts_with("job train: 1 trace, rank 4: failed\n"),
        "{one}"
    );
}
