//! One job of 8 ranks over two daemons (two nodes on one machine, `--node-name`): rank 5 on
//! node-a runs out of memory, and 1.5 s later the other 7 die, 4 of them on node-b. Each daemon
//! judges what it sees (node-b, on its own, can only blame its first crash); its /metrics lets
//! Prometheus find the first failure across both; `gpumon analyze` over both record
//! directories names rank 5 on node-a, with its file, and the 7 that followed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const GIB: u64 = 1 << 30;

/// Now, less the 20 steps the ranks report: samples and events carry the trainer's clock.
fn t0() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - 21.0
}

fn node(name: &str, dir: &Path) -> Daemon {
    Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec![
            "--node-name".into(),
            name.into(),
            "--record-dir".into(),
            dir.to_str().unwrap().into(),
        ]),
        ..DaemonOpts::default()
    })
}

struct Rank {
    s: UnixStream,
    rank: u64,
}

fn rank(d: &Daemon, rank: u64, run: &str) -> Rank {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(
        s,
        r#"{{"type":"hello","v":1,"pid":{},"job":"llama","run_id":"{run}","rank":{rank},"world_size":8,"gpu_uuid":"GPU-{rank}"}}"#,
        100 + rank
    )
    .unwrap();
    let mut welcome = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    Rank { s, rank }
}

impl Rank {
    fn steps(&mut self, n: u64) {
        let t0 = t0();
        let mut out = String::new();
        for step in 1..=n {
            out.push_str(&format!(
                "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{},\"allocated_bytes.all.peak\":{},\"reserved_bytes.all.current\":{}}},\"device_free\":{},\"device_total\":{}}}\n",
                t0 + step as f64,
                20 * GIB,
                (30 + self.rank) * GIB,
                40 * GIB,
                40 * GIB,
                80 * GIB,
            ));
        }
        self.s.write_all(out.as_bytes()).unwrap();
    }

    fn oom(&mut self, ts: f64) {
        writeln!(
            self.s,
            r#"{{"type":"event","ts":{ts},"kind":"oom","alloc_bytes":{},"device_free":104857600,"detail":"CUDA out of memory. Tried to allocate 2.00 GiB"}}"#,
            2 * GIB
        )
        .unwrap();
    }
}

fn job(d: &Daemon) -> serde_json::Value {
    let snap = d.snapshot();
    snap["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == "llama" && j["run_id"] == "run-42")
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

#[test]
fn a_job_over_two_nodes_names_its_first_failure_everywhere() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = node("node-a", dir_a.path());
    let b = node("node-b", dir_b.path());
    let mut ranks: Vec<Rank> = (0..4).map(|r| rank(&a, r, "run-42")).collect();
    ranks.extend((4..8).map(|r| rank(&b, r, "run-42")));
    for r in &mut ranks {
        r.steps(20);
    }
    // Another run of the same job name on node-a: never merged with run-42.
    let mut other = rank(&a, 0, "run-43");
    other.steps(5);
    a.wait_for(Duration::from_secs(10), "8 ranks seen", || {
        job(&a)["ranks"].as_array().is_some_and(|r| r.len() == 4)
            && job(&b)["ranks"].as_array().is_some_and(|r| r.len() == 4)
    });

    // Rank 1 (node-a) runs out of memory and dies; the others are taken down after it.
    ranks[1].oom(t0() + 21.0);
    std::thread::sleep(Duration::from_millis(200));
    let first = ranks.remove(1);
    drop(first);
    std::thread::sleep(Duration::from_millis(300));
    // Node-b's ranks first (their daemon cannot know rank 1), then node-a's.
    for r in ranks.drain(..).rev() {
        drop(r);
    }

    a.wait_for(Duration::from_secs(10), "node-a's job failed", || {
        job(&a)["consequences"]
            .as_array()
            .is_some_and(|c| c.len() == 3)
    });
    let ja = job(&a);
    assert_eq!(ja["state"], "failed");
    assert_eq!(ja["run_id"], "run-42");
    assert_eq!(ja["first_failure"]["rank"], 1);
    assert_eq!(ja["first_failure"]["kind"], "oom");
    assert_eq!(ja["first_failure"]["host"], "node-a");
    // One page on node-a: rank 1's oom; its crash and the 3 that followed are warnings.
    let snap = a.snapshot();
    let firing: Vec<&serde_json::Value> = snap["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["state"] == "firing" && f["run_id"] == "run-42")
        .collect();
    let critical: Vec<_> = firing
        .iter()
        .filter(|f| f["severity"] == "critical")
        .collect();
    assert_eq!(critical.len(), 1, "{firing:#?}");
    assert_eq!(
        (critical[0]["kind"].as_str(), critical[0]["rank"].as_u64()),
        (Some("oom"), Some(1))
    );
    assert!(firing
        .iter()
        .filter(|f| f["kind"] == "crash" && f["rank"] != 1)
        .all(|f| f["consequence_of"]["rank"] == 1 && f["severity"] == "warning"));

    b.wait_for(Duration::from_secs(10), "node-b's job failed", || {
        job(&b)["state"] == "failed"
    });
    // The other run is untouched.
    let snap = a.snapshot();
    let run43 = snap["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["run_id"] == "run-43")
        .unwrap();
    assert_eq!(run43["state"], "running");

    // /metrics: the failure times Prometheus compares across nodes, with the uid the ranks ran as.
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let ma = a.metrics();
    let mb = b.metrics();
    promtool_check(&ma);
    assert_eq!(
        sample(
            &ma,
            &format!(
                r#"gpumon_job_info{{job_name="llama",run_id="run-43",uid="{uid}",world_size="8"}}"#
            )
        ),
        Some(1.0)
    );
    let ts = |m: &str, rank: u64, kind: &str| {
        sample(
            m,
            &format!(
                r#"gpumon_job_rank_failed_timestamp_seconds{{job_name="llama",run_id="run-42",uid="{uid}",rank="{rank}",kind="{kind}"}}"#
            ),
        )
    };
    let oom_at = ts(&ma, 1, "oom").expect("rank 1's failure on node-a");
    let b_first = (4..8)
        .filter_map(|r| ts(&mb, r, "crash"))
        .fold(f64::MAX, f64::min);
    assert!(oom_at < b_first, "{oom_at} < {b_first}");
    assert!(ma.contains(r#"run_id="run-42""#));

    // Both daemons' traces, analysed together.
    drop(other);
    let out = Command::new(env!("CARGO_BIN_EXE_gpumon"))
        .args(["analyze", "--format", "json"])
        .arg(dir_a.path())
        .arg(dir_b.path())
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let jobs = report["jobs"].as_array().unwrap();
    let j = jobs.iter().find(|j| j["run_id"] == "run-42").unwrap();
    assert_eq!(j["ranks"].as_array().unwrap().len(), 8, "{j:#}");
    assert_eq!(j["hosts"], serde_json::json!(["node-a", "node-b"]));
    let f = &j["first_failure"];
    assert_eq!(
        (f["rank"].as_u64(), f["kind"].as_str(), f["host"].as_str()),
        (Some(1), Some("oom"), Some("node-a"))
    );
    assert!(f["file"]
        .as_str()
        .unwrap()
        .starts_with(dir_a.path().to_str().unwrap()));
    assert_eq!(j["consequences"].as_array().unwrap().len(), 7, "{j:#}");
    let text = Command::new(env!("CARGO_BIN_EXE_gpumon"))
        .arg("analyze")
        .arg(dir_a.path())
        .arg(dir_b.path())
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains(&format!("job llama (run run-42, uid {uid})")),
        "{text}"
    );
    assert!(text.contains(": failed: rank 1 oom on node-a"), "{text}");
}

/// `n` steps of a leak: the floor grows 64 MiB a step after a warm-up of 300, as every rank of
/// a run that keeps its losses alive does.
fn leaking_steps(r: &mut Rank, n: u64, t0: f64) {
    let mut out = String::new();
    for step in 1..=n {
        let floor =
            10 * GIB + step.saturating_sub(300) * (64 << 20) + (step * 7919 % 97) * (1 << 20);
        out.push_str(&format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{floor},\"allocated_bytes.all.peak\":{},\"reserved_bytes.all.current\":{}}},\"device_free\":{},\"device_total\":{}}}\n",
            t0 + step as f64 * 0.01,
            floor + 2 * GIB,
            floor + 3 * GIB,
            20 * GIB,
            200 * GIB,
        ));
    }
    r.s.write_all(out.as_bytes()).unwrap();
}

/// All 8 ranks leak alike and rank 5 runs out of memory, taking the rest down: once every rank
/// is gone, the dead job still says what was behind its failure, live and in `gpumon analyze`.
#[test]
fn a_dead_job_names_the_leak_on_every_rank_behind_its_oom() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec![
            "--record-dir".into(),
            dir.path().to_str().unwrap().into(),
        ]),
        config: "[ingest]\nmax_lines_per_second = 1000000\n".into(),
        ..DaemonOpts::default()
    });
    const STEPS: u64 = 1500;
    let t0 = t0() - STEPS as f64 * 0.01;
    let mut ranks: Vec<Rank> = (0..8).map(|r| rank(&d, r, "run-7")).collect();
    for r in &mut ranks {
        leaking_steps(r, STEPS, t0);
    }
    d.wait_for(Duration::from_secs(60), "a leak on each of 8 ranks", || {
        job_of(&d.snapshot(), "run-7")["findings"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["kind"] == "leak"))
            .is_some_and(|f| f["ranks"].as_array().is_some_and(|r| r.len() == 8))
    });
    let oom_ts = t0 + STEPS as f64 * 0.01 + 0.5;
    let mut five = ranks.remove(5);
    five.oom(oom_ts);
    std::thread::sleep(Duration::from_millis(200));
    drop(five);
    std::thread::sleep(Duration::from_millis(200));
    ranks.clear();
    d.wait_for(Duration::from_secs(10), "every rank gone", || {
        job_of(&d.snapshot(), "run-7")["members"]
            .as_array()
            .is_some_and(|m| m.len() == 8 && m.iter().all(|m| !m["ended"].is_null()))
    });
    let j = job_of(&d.snapshot(), "run-7");
    assert_eq!(j["state"], "failed", "{j:#}");
    assert_eq!(j["first_failure"]["rank"], 5);
    assert_eq!(j["first_failure"]["kind"], "oom");
    // Nothing fires now, and the story is kept.
    assert!(j["findings"].as_array().unwrap().is_empty(), "{j:#}");
    let before = j["findings_at_failure"].as_array().unwrap();
    assert_eq!(before.len(), 1, "{j:#}");
    assert_eq!(before[0]["kind"], "leak");
    assert_eq!(
        before[0]["ranks"],
        serde_json::json!([0, 1, 2, 3, 4, 5, 6, 7])
    );
    let status = Command::new(env!("CARGO_BIN_EXE_gpumon"))
        .args(["--config", "/dev/null", "status", "--connect", &d.url("")])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    eprintln!("{status}");
    assert!(
        status.contains("failed: leak on 8 of 8 ranks, then rank 5 oom"),
        "{status}"
    );
    assert!(
        status.contains("before it: leak on 8 of 8 ranks (0-7)"),
        "{status}"
    );

    // The same story offline, from the recording.
    drop(d);
    let out = Command::new(env!("CARGO_BIN_EXE_gpumon"))
        .args(["analyze", "--format", "json"])
        .arg(dir.path())
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let j = report["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["run_id"] == "run-7")
        .unwrap();
    assert_eq!(j["first_failure"]["rank"], 5, "{j:#}");
    let before = j["findings_at_failure"].as_array().unwrap();
    assert_eq!(before.len(), 1, "{j:#}");
    assert_eq!(before[0]["kind"], "leak");
    assert_eq!(before[0]["ranks"].as_array().unwrap().len(), 8, "{j:#}");
}

fn job_of(snap: &serde_json::Value, run: &str) -> serde_json::Value {
    snap["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["run_id"] == run)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}
