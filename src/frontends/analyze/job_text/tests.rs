#![allow(clippy::unwrap_used)]
use super::*;
use crate::core::detect::Kind;
use crate::core::jobs::verdict::{verdict, Basis, Rules};
use crate::core::jobs::{Failure, Member};

fn member(session: &str, rank: Option<u64>, crashed: bool) -> Member {
    failed_at(session, rank, crashed.then_some(5.0))
}

fn failed_at(session: &str, rank: Option<u64>, at: Option<f64>) -> Member {
    Member {
        session: session.into(),
        rank,
        host: None,
        file: Some(format!("{session}.jsonl")),
        pid: 7,
        gpu_uuid: None,
        started: 0.0,
        ended: at,
        failure: at.map(|ts| Failure {
            kind: Kind::Crash,
            ts,
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
    report_of(&judged(members))
}

fn judged(members: Vec<Member>) -> JobView {
    verdict(
        Basis {
            job: "train".into(),
            members,
            ..Basis::default()
        },
        &Rules::default(),
    )
}

fn report_of(v: &JobView) -> String {
    let mut out = String::new();
    jobs(&mut out, std::slice::from_ref(v));
    out
}

#[test]
fn a_trace_without_a_rank_prints_no_empty_rank() {
    let out = report(vec![member("s-1", None, true)]);
    assert!(
        out.starts_with("job train: 1 trace, no rank: failed: session s-1 crash at step 3\n"),
        "{out}"
    );
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
        out.starts_with("job train: 3 traces, ranks 0-2: failed: rank 0 crash at step 3\n"),
        "{out}"
    );
    let one = report(vec![member("s-4", Some(4), true)]);
    assert!(
        one.starts_with("job train: 1 trace, rank 4: failed: rank 4 crash at step 3\n"),
        "{one}"
    );
}

#[test]
fn the_verdict_and_the_failures_after_the_first_read_as_the_core_words_them() {
    // Rank 1 follows within the cascade window; rank 2 fails two minutes on, past it.
    let v = judged(vec![
        failed_at("s-0", Some(0), Some(5.0)),
        failed_at("s-1", Some(1), Some(6.0)),
        failed_at("s-2", Some(2), Some(125.0)),
    ]);
    let out = report_of(&v);
    let head = format!("job train: 3 traces, ranks 0-2: {}\n", summary(&v));
    assert!(out.starts_with(&head), "{out}");
    assert!(
        head.contains("failed: rank 0 crash at step 3, then 1 rank within 1.0 s"),
        "{head}"
    );
    assert!(out.contains("\n  s-0.jsonl\n  exited\n"), "{out}");
    assert!(
        out.contains("\n  followed: rank 1 crash +1.0 s  s-1.jsonl\n"),
        "{out}"
    );
    let later = later_failures(&v.other_failures, 1).unwrap();
    assert_eq!(later, "failed past the cascade window: rank 2 crash +2m");
    assert!(out.contains(&format!("\n  {later}\n")), "{out}");
}
