//! A job identity no one else can take (docs/jobs.md): on one real daemon, a user who opens
//! (llama, 42) first gets none of root's ranks of (llama, 42); its crash is not root's cause,
//! and root's OOM stays a critical cause. A rank cannot backdate an OOM before its own lines to
//! take over as the cause. The two jobs stay two in the API, /metrics, `gpumon status` and
//! `gpumon analyze` (traces carry the uid the daemon read off the socket). One user's
//! hello-then-close flood does not keep another user's ranks out of their job.
//! Needs root (to connect as another uid); elsewhere each test says so and passes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod identity;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use identity::*;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

fn node(dir: &Path) -> Daemon {
    Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec![
            "--node-name".into(),
            "node-a".into(),
            "--record-dir".into(),
            dir.to_str().unwrap().into(),
        ]),
        ..DaemonOpts::default()
    })
}

/// The jobs named (`job`, `run`), by uid.
fn jobs_of(snap: &Value, job: &str, run: &str) -> Vec<Value> {
    let mut v: Vec<Value> = snap["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["job"] == job && j["run_id"] == run)
        .cloned()
        .collect();
    v.sort_by_key(|j| j["uid"].as_u64());
    v
}

fn ranks(j: &Value) -> Vec<u64> {
    j["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .collect()
}

#[test]
fn another_user_cannot_join_overturn_or_merge_with_roots_job() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path());
    let socket = d.socket.clone();
    // The other user opens (llama, 42) first, and says it is uid 0: the daemon never asks.
    let mut bait = as_uid(OTHER, move || {
        connect(&socket, "llama", "42", 0, 8, r#","uid":0"#)
    });
    bait.steps(5);
    // Nor can it write the recorder's line for itself: a trainer's `trace_peer` is refused, never
    // recorded.
    writeln!(
        bait.s,
        r#"{{"type":"trace_peer","uid":0,"ts":{}}}"#,
        unix_now()
    )
    .unwrap();
    let mut root: Vec<Rank> = (0..8)
        .map(|r| connect(&d.socket, "llama", "42", r, 8, ""))
        .collect();
    for r in &mut root {
        r.steps(20);
    }
    d.wait_for(WAIT, "two jobs of (llama, 42)", || {
        let j = jobs_of(&d.snapshot(), "llama", "42");
        j.len() == 2 && ranks(&j[0]).len() == 8
    });

    // The bait crashes first; then root's rank 5 runs out of memory and dies.
    drop(bait);
    d.wait_for(WAIT, "the bait's job failed", || {
        jobs_of(&d.snapshot(), "llama", "42")
            .iter()
            .any(|j| j["uid"] == OTHER && j["state"] == "failed")
    });
    let oom_at = unix_now();
    root[5].oom(oom_at);
    std::thread::sleep(Duration::from_millis(200));
    drop(root.remove(5));
    // Rank 3 (index 3) goes on a moment, then sends an OOM dated a second before rank 5's: it is
    // clamped to its own previous line, after rank 5's OOM, and stays a consequence.
    std::thread::sleep(Duration::from_millis(300));
    let later = unix_now();
    root[3].sample(later, 21);
    root[3].oom(oom_at - 1.0);
    std::thread::sleep(Duration::from_millis(200));
    drop(root.remove(3));
    root.clear();

    d.wait_for(WAIT, "root's job judged", || {
        let j = jobs_of(&d.snapshot(), "llama", "42");
        j.len() == 2
            && j[0]["consequences"]
                .as_array()
                .is_some_and(|c| c.len() == 7)
    });
    let snap = d.snapshot();
    let jobs = jobs_of(&snap, "llama", "42");
    let (mine, theirs) = (&jobs[0], &jobs[1]);
    assert_eq!(
        (mine["uid"].as_u64(), theirs["uid"].as_u64()),
        (Some(0), Some(u64::from(OTHER)))
    );
    assert_eq!(ranks(mine), (0..8).collect::<Vec<_>>(), "{mine:#}");
    assert_eq!(ranks(theirs), vec![0], "{theirs:#}");
    let f = &mine["first_failure"];
    assert_eq!(
        (f["rank"].as_u64(), f["kind"].as_str()),
        (Some(5), Some("oom")),
        "{mine:#}"
    );
    assert!(f["ts"].as_f64().unwrap() >= oom_at - 0.01, "{mine:#}");
    let three = mine["consequences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["rank"] == 3)
        .unwrap();
    assert_eq!(three["kind"], "oom");
    assert!(
        three["ts"].as_f64().unwrap() >= later - 0.01,
        "clamped: {three}"
    );
    assert_eq!(theirs["first_failure"]["kind"], "crash");

    // Root's OOM pages (critical, no consequence_of); rank 3's OOM follows it.
    let findings = snap["findings"].as_array().unwrap();
    let of = |rank: u64, kind: &str| {
        findings
            .iter()
            .find(|x| {
                x["uid"] == 0 && x["rank"] == rank && x["kind"] == kind && x["job"] == "llama"
            })
            .unwrap_or_else(|| panic!("no {kind} of rank {rank}: {findings:#?}"))
    };
    let five = of(5, "oom");
    assert_eq!(five["severity"], "critical", "{five:#}");
    assert!(
        five.get("consequence_of").is_none_or(Value::is_null),
        "{five:#}"
    );
    assert_eq!(of(3, "crash")["consequence_of"]["rank"], 5);
    assert!(findings
        .iter()
        .filter(|x| x["uid"] == OTHER)
        .all(|x| x.get("consequence_of").is_none_or(Value::is_null)));

    // /metrics: the uid label keeps the two apart for Prometheus.
    let m = d.metrics();
    promtool_check(&m);
    let failed = |uid: u32, rank: u64, kind: &str| {
        sample(
            &m,
            &format!(
                r#"gpumon_job_rank_failed_timestamp_seconds{{job_name="llama",run_id="42",uid="{uid}",rank="{rank}",kind="{kind}"}}"#
            ),
        )
    };
    let five_at = failed(0, 5, "oom").expect("root's rank 5");
    assert!(failed(OTHER, 0, "crash").expect("the bait's crash") < five_at);
    assert!(failed(0, 3, "oom").expect("rank 3") > five_at);
    assert!(sample(&m, "gpumon_ingest_timestamps_clamped_total").unwrap() >= 1.0);

    // `gpumon status`: two rows of llama (run 42), told apart by their uid.
    let out = Command::new(BIN)
        .args(["status", "--listen", &d.addr.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("llama (run 42)"))
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    let uid_of = |l: &str| {
        l["llama (run 42)".len()..]
            .split_whitespace()
            .next()
            .map(str::to_string)
    };
    let mut uids: Vec<String> = rows.iter().filter_map(|l| uid_of(l)).collect();
    uids.sort();
    assert_eq!(uids, ["0", &OTHER.to_string()], "{text}");

    // `gpumon analyze` over the record directory: two jobs, by the uid each trace's header says.
    d.stop();
    let out = Command::new(BIN)
        .args(["analyze", "--format", "json"])
        .arg(dir.path())
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = jobs_of(&report, "llama", "42");
    assert_eq!(jobs.len(), 2, "{:#}", report["jobs"]);
    assert_eq!(ranks(&jobs[0]).len(), 8);
    assert_eq!(jobs[0]["uid"], 0);
    assert_eq!(jobs[1]["uid"], OTHER);
    let bait_trace = report["traces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["uid"] == OTHER)
        .expect("the bait's trace says its uid");
    assert_eq!(
        bait_trace["bad_line_count"], 0,
        "refused lines are not recorded: {bait_trace:#}"
    );
    let f = &jobs[0]["first_failure"];
    assert_eq!(
        (f["rank"].as_u64(), f["kind"].as_str()),
        (Some(5), Some("oom")),
        "{:#}",
        jobs[0]
    );
    let text = Command::new(BIN)
        .arg("analyze")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("job llama (run 42, uid 0)"), "{text}");
    assert!(
        text.contains(&format!("job llama (run 42, uid {OTHER})")),
        "{text}"
    );
}

#[test]
fn one_users_hello_then_close_flood_leaves_room_for_anothers_ranks() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = node(dir.path());
    let socket = d.socket.clone();
    // 4 live sessions, then 255 hello-then-close connections in each of their runs: 1,024
    // sessions, every job record there is.
    let live = as_uid(OTHER, move || {
        let mut live = Vec::new();
        for k in 0..4 {
            let run = format!("flood-{k}");
            live.push(connect(&socket, "x", &run, 0, 1024, ""));
            for r in 1..256 {
                drop(connect(&socket, "x", &run, r, 1024, ""));
            }
        }
        live
    });
    let members = |snap: &Value| -> usize {
        snap["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["job"] == "x")
            .map(|j| j["members"].as_array().map_or(0, Vec::len))
            .sum()
    };
    d.wait_for(WAIT, "the flood holds every job record", || {
        members(&d.snapshot()) == 1024
    });
    let ungrouped = sample(&d.metrics(), "gpumon_jobs_ungrouped_total").unwrap();

    let root: Vec<Rank> = (0..8)
        .map(|r| connect(&d.socket, "bert", "7", r, 8, ""))
        .collect();
    d.wait_for(WAIT, "root's 8 ranks in one job", || {
        jobs_of(&d.snapshot(), "bert", "7")
            .first()
            .is_some_and(|j| ranks(j).len() == 8)
    });
    let snap = d.snapshot();
    assert_eq!(jobs_of(&snap, "bert", "7").len(), 1);
    assert_eq!(jobs_of(&snap, "bert", "7")[0]["uid"], 0);
    assert!(
        members(&snap) <= 1024 - 8,
        "only the flood's ended sessions made room"
    );
    assert_eq!(
        sample(&d.metrics(), "gpumon_jobs_ungrouped_total").unwrap(),
        ungrouped,
        "none of root's sessions went ungrouped"
    );
    drop((live, root));
}

/// A run whose ranks run as one user on node-a and as root on node-b (docs/jobs.md, "Across
/// nodes"): one job per uid, each with its own first failure, in `gpumon analyze` over both
/// nodes' record directories as on each daemon.
#[test]
fn a_run_under_two_uids_on_two_nodes_is_one_job_per_uid_everywhere() {
    if !is_root() {
        return;
    }
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = node(dir_a.path());
    let b = Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec![
            "--node-name".into(),
            "node-b".into(),
            "--record-dir".into(),
            dir_b.path().to_str().unwrap().into(),
        ]),
        ..DaemonOpts::default()
    });
    let socket = a.socket.clone();
    let mut on_a: Vec<Rank> = as_uid(OTHER, move || {
        (0..4)
            .map(|r| connect(&socket, "llama", "99", r, 8, ""))
            .collect()
    });
    let mut on_b: Vec<Rank> = (4..8)
        .map(|r| connect(&b.socket, "llama", "99", r, 8, ""))
        .collect();
    for r in on_a.iter_mut().chain(on_b.iter_mut()) {
        r.steps(10);
    }
    // Root's rank 6 on node-b runs out of memory first; node-a's rank 2 crashes 0.5 s later,
    // then the rest. Merged, rank 2 would be a consequence of rank 6.
    on_b[2].oom(unix_now());
    std::thread::sleep(Duration::from_millis(200));
    drop(on_b.remove(2));
    std::thread::sleep(Duration::from_millis(500));
    drop(on_a.remove(2));
    std::thread::sleep(Duration::from_millis(300));
    on_a.clear();
    on_b.clear();
    for d in [&a, &b] {
        d.wait_for(WAIT, "the node's job failed", || {
            jobs_of(&d.snapshot(), "llama", "99")
                .first()
                .is_some_and(|j| {
                    j["state"] == "failed"
                        && j["consequences"].as_array().is_some_and(|c| c.len() == 3)
                })
        });
    }
    a.stop();
    b.stop();
    let out = Command::new(BIN)
        .args(["analyze", "--format", "json"])
        .arg(dir_a.path())
        .arg(dir_b.path())
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = jobs_of(&report, "llama", "99");
    assert_eq!(jobs.len(), 2, "{:#}", report["jobs"]);
    let (root, user) = (&jobs[0], &jobs[1]);
    assert_eq!(
        (root["uid"].as_u64(), user["uid"].as_u64()),
        (Some(0), Some(u64::from(OTHER)))
    );
    assert_eq!(ranks(root), vec![4, 5, 6, 7]);
    assert_eq!(ranks(user), vec![0, 1, 2, 3]);
    let first = |j: &Value| {
        let f = &j["first_failure"];
        (
            f["rank"].as_u64(),
            f["kind"].as_str().map(str::to_string),
            f["host"].as_str().map(str::to_string),
        )
    };
    assert_eq!(
        first(root),
        (Some(6), Some("oom".into()), Some("node-b".into())),
        "{root:#}"
    );
    assert_eq!(
        first(user),
        (Some(2), Some("crash".into()), Some("node-a".into())),
        "{user:#}"
    );
}
