#![allow(clippy::unwrap_used)]
use super::*;
use crate::core::jobs::verdict::{verdict, Basis};
use crate::core::jobs::{Failure, Member};
use crate::frontends::tui::app::node::{Clock, Origin};
use crate::frontends::tui::fixtures;

fn member(r: u64, host: Option<&str>, failed_at: Option<f64>) -> Member {
    Member {
        session: format!("s-{}", r % 2 + 1),
        rank: Some(r),
        host: host.map(Into::into),
        file: None,
        pid: r as u32,
        gpu_uuid: None,
        started: 0.0,
        ended: failed_at,
        failure: failed_at.map(|ts| Failure {
            kind: Kind::Crash,
            ts,
            step: None,
            message: String::new(),
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

use crate::core::detect::Kind;

/// A node named `host` whose daemon serves `jobs` (its members named on no host).
fn node(host: &str, jobs: Vec<JobView>) -> Node {
    let mut s = fixtures::snapshot(host, vec![], vec![], vec![], vec![]);
    s.jobs = jobs;
    let mut n = Node::new(Origin::Daemon {
        url: format!("http://{host}:9477"),
    });
    n.absorb(s);
    n
}

fn view(run: Option<&str>, ranks: [u64; 2], failed: Option<f64>) -> JobView {
    verdict(
        Basis {
            job: "llama".into(),
            run_id: run.map(Into::into),
            world_size: Some(4),
            members: ranks.iter().map(|r| member(*r, None, failed)).collect(),
            ..Basis::default()
        },
        &Rules::default(),
    )
}

#[test]
fn one_run_on_two_daemons_is_one_job_and_each_session_finds_it() {
    // Both daemons number their sessions s-1 and s-2: the node tells them apart.
    let a = node("node-a", vec![view(Some("r1"), [0, 1], Some(10.0))]);
    let b = node("node-b", vec![view(Some("r1"), [2, 3], Some(9.0))]);
    let jobs = Jobs::build(&[a, b]);
    assert_eq!(jobs.list.len(), 1);
    let v = &jobs.list[0].view;
    assert_eq!(v.ranks, [0, 1, 2, 3]);
    assert_eq!(v.hosts, ["node-a", "node-b"]);
    // The members named no host: each took its daemon's, so the verdict can say where.
    let f = v.first_failure.as_ref().unwrap();
    assert_eq!((f.rank, f.host.as_deref()), (Some(2), Some("node-b")));
    for n in 0..2 {
        for s in ["s-1", "s-2"] {
            assert_eq!(jobs.of(n, s), Some(0), "node {n} {s}");
        }
    }
    assert_eq!(jobs.of(2, "s-1"), None);
}

#[test]
fn a_job_one_daemon_sees_stays_as_it_judged_it() {
    // A cascade window the TUI cannot know: node-a's daemon held rank 1's crash, 90 s on,
    // to follow rank 0's; judged again by the default 60 s it would not.
    let mut v = view(Some("r1"), [0, 1], Some(10.0));
    v.consequences[0].after_seconds = 90.0;
    let jobs = Jobs::build(&[node("node-a", vec![v.clone()]), node("node-b", vec![])]);
    assert_eq!(jobs.list.len(), 1);
    let c = &jobs.list[0].view.consequences;
    assert_eq!((c.len(), c[0].rank, c[0].after_seconds), (1, Some(1), 90.0));
    assert_eq!(jobs.list[0].view.hosts, ["node-a"]);
}

#[test]
fn runs_without_an_id_and_two_connections_to_one_daemon_are_not_merged() {
    let a = node("node-a", vec![view(None, [0, 1], None)]);
    let b = node("node-b", vec![view(None, [2, 3], None)]);
    assert_eq!(Jobs::build(&[a, b]).list.len(), 2);
    let once = node("node-a", vec![view(Some("r1"), [0, 1], None)]);
    let twice = once.clone();
    let jobs = Jobs::build(&[once, twice]);
    assert_eq!(jobs.list.len(), 1);
    assert_eq!(jobs.list[0].view.members.len(), 2);
}

#[test]
fn failed_jobs_come_first_and_leave_the_overview_with_their_findings() {
    let run = node(
        "node-a",
        vec![
            view(Some("r2"), [0, 1], None),
            view(Some("r1"), [0, 1], Some(10.0)),
        ],
    );
    let jobs = Jobs::build(&[run]);
    let states: Vec<JobState> = jobs.list.iter().map(|j| j.view.state).collect();
    assert_eq!(states, [JobState::Failed, JobState::Running]);
    // No finding about the failed one fires any more: it is done.
    assert!(!jobs.list[0].shown());
    assert!(jobs.list[1].shown());
}

#[test]
fn the_clock_believes_the_answer_with_the_shortest_round_trip() {
    let mut c = Clock::default();
    assert_eq!(c.offset(), None);
    // 2 s round trip, off by 0.9 (or anything within 1 s); 10 ms, off by 0.2.
    c.sample(100.9, 99.0, 101.0);
    c.sample(200.2, 199.995, 200.005);
    c.sample(300.7, 299.0, 301.0);
    assert!((c.offset().unwrap() - 0.2).abs() < 1e-9);
    // Only the newest few count: a short round trip long ago is forgotten.
    for i in 0..8 {
        c.sample(
            400.0 + f64::from(i) + 1.0,
            399.5 + f64::from(i),
            400.5 + f64::from(i),
        );
    }
    assert!((c.offset().unwrap() - 1.0).abs() < 1e-9);
}

#[test]
fn two_jobs_of_one_run_id_on_one_daemon_stay_two() {
    // Two users' jobs of one name and run id: the daemon keeps them apart, and so does the TUI.
    let a = node(
        "node-a",
        vec![
            view(Some("r1"), [0, 1], None),
            view(Some("r1"), [2, 3], None),
        ],
    );
    assert_eq!(Jobs::build(&[a]).list.len(), 2);
}
