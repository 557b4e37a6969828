//! `gpumon analyze` replays a record directory as the daemon that wrote it lived it: its traces
//! in one core, interleaved by time, so a crash that followed another rank's is that rank's
//! consequence, worded and graded as live. Traces of different directories are different
//! daemons: a job without a run id is never joined across them (docs/jobs.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");
const GIB: u64 = 1 << 30;
const T0: u64 = 1_763_700_000;

/// Samples at steps 0..=`last`, a second apart from `T0`, 2 GiB allocated throughout.
fn flat_samples(out: &mut String, last: u64) {
    for s in 0..=last {
        out.push_str(&format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{s},\"stats\":{{\"allocated_bytes.all.current\":{}}}}}\n",
            T0 + s,
            2 * GIB
        ));
    }
}

/// A rank of a 2-rank job without a run id that sends samples 0..=`last` a second apart and
/// ends without bye (a crash, at its last sample).
fn rank(dir: &Path, rank: u64, last: u64) -> PathBuf {
    let mut out = format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":{},\"job\":\"pair\",\"rank\":{rank},\"world_size\":2}}\n",
        100 + rank
    );
    flat_samples(&mut out, last);
    let path = dir.join(format!("rank{rank}.trace.jsonl"));
    std::fs::write(&path, out).unwrap();
    path
}

fn analyze(args: &[&Path]) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["analyze", "--format", "json"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The crash finding of the trace read from `file`.
fn crash<'a>(report: &'a serde_json::Value, file: &Path) -> &'a serde_json::Value {
    let t = report["traces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["file"] == file.to_str().unwrap())
        .unwrap();
    t["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "crash")
        .unwrap_or_else(|| panic!("no crash in {t:#}"))
}

#[test]
fn one_directory_is_one_daemon_and_a_crash_after_another_ranks_is_its_consequence() {
    let dir = tempfile::tempdir().unwrap();
    // Rank 1 dies at second 20, rank 0 a second later: the cascade.
    let r0 = rank(dir.path(), 0, 21);
    let r1 = rank(dir.path(), 1, 20);
    let report = analyze(&[dir.path()]);

    let first = crash(&report, &r1);
    assert_eq!(first["severity"], "critical", "{first:#}");
    assert!(first.get("consequence_of").is_none(), "{first:#}");
    let after = crash(&report, &r0);
    assert_eq!(after["severity"], "warning", "{after:#}");
    assert_eq!(after["consequence_of"]["rank"], 1, "{after:#}");
    // The cause named by its session, as live; the report's trace of that session is its file.
    let cause = report["traces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["session"] == after["consequence_of"]["session"])
        .unwrap_or_else(|| panic!("no trace of the cause: {report:#}"));
    assert_eq!(cause["file"], r1.to_str().unwrap(), "{after:#}");
    // Worded as the daemon words it live.
    let message = after["message"].as_str().unwrap();
    assert!(message.contains("after rank 1's crash"), "{message}");

    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    assert_eq!(jobs[0]["first_failure"]["rank"], 1);
    assert_eq!(jobs[0]["first_failure"]["file"], r1.to_str().unwrap());
    assert_eq!(jobs[0]["members"].as_array().unwrap().len(), 2);

    // The same files named one by one are the same node: their directory's.
    let loose = analyze(&[&r0, &r1]);
    assert_eq!(crash(&loose, &r0)["consequence_of"]["rank"], 1);

    // Traces without a `trace_host` line name no host (not an empty one).
    let out = Command::new(BIN)
        .arg("analyze")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("job pair (uid 0): 2 traces, ranks 0,1: failed"),
        "{text}"
    );
    assert!(
        text.contains("ranks 0,1: failed: rank 1 crash at step 20"),
        "{text}"
    );
    assert!(text.contains("followed: rank 0 crash +1.0 s "), "{text}");
}

#[test]
fn two_directories_are_two_daemons_and_a_job_without_run_id_is_not_joined_across_them() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let r0 = rank(a.path(), 0, 21);
    let r1 = rank(b.path(), 1, 20);
    let report = analyze(&[a.path(), b.path()]);

    for file in [&r0, &r1] {
        let c = crash(&report, file);
        assert_eq!(c["severity"], "critical", "{c:#}");
        assert!(c.get("consequence_of").is_none(), "{c:#}");
    }
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:#?}");
    assert!(jobs
        .iter()
        .all(|j| j["members"].as_array().unwrap().len() == 1));
}

/// A rank of job `wide` (run `run-x`) as node `host`'s recorder wrote it: named and headed as
/// its daemon names it, the session id `id`.
fn recorded_rank(dir: &Path, host: &str, id: &str, rank: u64, last: u64) -> PathBuf {
    let mut out = format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":{},\"job\":\"wide\",\"run_id\":\"run-x\",\"rank\":{rank},\"world_size\":2}}\n\
         {{\"type\":\"trace_host\",\"host\":\"{host}\",\"ts\":{T0}.000}}\n",
        100 + rank
    );
    flat_samples(&mut out, last);
    let path = dir.join(format!("gpumon-{T0}-{id}-wide-r{rank}.trace.jsonl"));
    std::fs::write(&path, out).unwrap();
    path
}

#[test]
fn sessions_take_their_daemons_ids_and_two_daemons_that_gave_one_id_are_two_members() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Both daemons started in the same millisecond: each named its trainer `s-mi8dfxmo-1`.
    let r0 = recorded_rank(a.path(), "node-a", "s-mi8dfxmo-1", 0, 21);
    let r1 = recorded_rank(b.path(), "node-b", "s-mi8dfxmo-1", 1, 20);
    let report = analyze(&[a.path(), b.path()]);

    let traces = report["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2, "{report:#}");
    assert!(
        traces.iter().all(|t| t["session"] == "s-mi8dfxmo-1"),
        "{report:#}"
    );
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    let first = &jobs[0]["first_failure"];
    assert_eq!(
        (&first["rank"], &first["host"], &first["file"]),
        (&1.into(), &"node-b".into(), &r1.to_str().unwrap().into()),
        "{jobs:#?}"
    );
    // Rank 0 is not rank 1 for sharing its id: it followed, on its own host.
    let followed = jobs[0]["consequences"].as_array().unwrap();
    assert_eq!(followed.len(), 1, "{jobs:#?}");
    assert_eq!(followed[0]["rank"], 0);
    assert_eq!(followed[0]["host"], "node-a");
    assert_eq!(followed[0]["file"], r0.to_str().unwrap());

    // The text names each trace's session, as messages name it.
    let out = Command::new(BIN)
        .arg("analyze")
        .args([a.path(), b.path()])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for r in [&r0, &r1] {
        let line = text
            .lines()
            .find(|l| l.starts_with(r.to_str().unwrap()))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.contains(" session=s-mi8dfxmo-1 "), "{line}");
    }
}
