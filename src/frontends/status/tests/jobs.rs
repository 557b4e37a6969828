//! The jobs section: a failed 4-rank run (rank 2 out of memory, the other three taken down
//! within 2 s), a running 2-rank run with a leak on both ranks and a conflict, and a run of one
//! rank, which the trainer table already shows.

use crate::core::detect::Kind;
use crate::core::jobs::verdict::{verdict, Basis, Rules};
use crate::core::jobs::view::MemberFinding;
use crate::core::jobs::{Failure, JobView, Member};
use crate::core::snapshot::Snapshot;
use crate::frontends::tui::fixtures;

use super::super::{table, Origin};

const GIB: u64 = 1 << 30;
const OOM_AT: f64 = fixtures::NOW - 30.0;
const OOM: &str = "CUDA out of memory: tried to allocate 16.0 GiB with 11.2 GiB free";

fn member(rank: u64, failure: Option<(Kind, f64)>) -> Member {
    Member {
        session: format!("s-{}", rank + 1),
        rank: Some(rank),
        host: Some("node-a".into()),
        file: None,
        pid: 4100 + rank as u32,
        gpu_uuid: Some("GPU-0".into()),
        started: fixtures::NOW - 600.0,
        ended: failure.map(|(_, after)| OOM_AT + after),
        failure: failure.map(|(kind, after)| Failure {
            kind,
            ts: OOM_AT + after,
            step: Some(812),
            message: if kind == Kind::Oom { OOM } else { "no bye" }.into(),
            exception: None,
            signal: None,
        }),
        peak_bytes: Some(if rank == 2 {
            4 * GIB + GIB / 2
        } else {
            3 * GIB + GIB / 2
        }),
        headroom_bytes: None,
        oom_eta_seconds: None,
        findings: Vec::new(),
        stray: Vec::new(),
    }
}

fn job(name: &str, run: &str, world: u64, members: Vec<Member>) -> JobView {
    verdict(
        Basis {
            job: name.into(),
            run_id: Some(run.into()),
            uid: Some(1000),
            world_size: Some(world),
            members,
            ..Basis::default()
        },
        &Rules::default(),
    )
}

/// Rank 2 out of memory at step 812; ranks 0, 1 and 3 down 1.2, 1.5 and 1.8 s later.
pub fn failed() -> JobView {
    let after = [1.2, 1.5, 0.0, 1.8];
    let members = (0..4)
        .map(|r| {
            let kind = if r == 2 { Kind::Oom } else { Kind::Crash };
            member(r, Some((kind, after[r as usize])))
        })
        .collect();
    job("train-ddp", "r-42", 4, members)
}

/// Two live ranks, both leaking, rank 1 forecast to run out first; and a conflict.
fn leaking(name: &str, run: &str, conflict: &str) -> JobView {
    let members = (0..2)
        .map(|r| {
            let mut m = member(r, None);
            m.headroom_bytes = Some([-(GIB as i64) / 2, 6 * GIB as i64][r as usize]);
            m.oom_eta_seconds = Some([900.0, 240.0][r as usize]);
            m.findings = vec![MemberFinding {
                kind: Kind::Leak,
                message: "allocated floor grows 8.0 MiB/step".into(),
            }];
            m
        })
        .collect();
    let mut v = job(name, run, 2, members);
    v.conflicts.push(conflict.into());
    v
}

fn node(jobs: Vec<JobView>) -> Snapshot {
    let mut snap = fixtures::crowded("node-a", 1, 4, 1);
    snap.jobs = jobs;
    snap
}

fn origin() -> Origin {
    Origin::Daemon("http://127.0.0.1:9477/api/v1/snapshot".into())
}

/// The section's lines: from its header to the next blank line.
fn section(out: &str) -> Vec<&str> {
    out.lines()
        .skip_while(|l| !l.starts_with("JOB "))
        .take_while(|l| !l.is_empty())
        .collect()
}

#[test]
fn a_failed_job_says_which_rank_failed_first_and_who_followed() {
    let single = job("notebook", "n-1", 1, vec![member(0, None)]);
    let out = table(&node(vec![failed(), single]), &origin());
    let lines = section(&out);
    assert_eq!(
        lines,
        [
            "JOB                                     UID STATE      RANKS  VERDICT",
            "train-ddp (run r-42)                   1000 failed       4/4  failed: rank 2 oom on node-a at step 812, then 3 ranks within 1.8 s",
            &format!("  rank 2 oom: {OOM}"),
            "  followed: rank 0 crash +1.2 s, rank 1 crash +1.5 s, rank 3 crash +1.8 s",
            "  memory: peaks 3.5 GiB-4.5 GiB (highest rank 2)",
        ],
        "{out}"
    );
    // Before the trainer table, which goes on as before.
    let at = |s: &str| out.find(s).unwrap_or_else(|| panic!("no {s:?} in {out}"));
    assert!(at("train-ddp (run") < at("  FINDINGS"), "{out}");
    assert!(
        !out.contains("notebook"),
        "a one-rank job is its trainer row: {out}"
    );
}

#[test]
fn a_running_job_shows_its_spread_headroom_forecast_findings_and_conflicts() {
    let v = leaking(
        "llm",
        "7",
        "rank 1 claimed by two processes: s-2 (pid 4101) and s-9 (pid 77)",
    );
    let out = table(&node(vec![v]), &origin());
    let lines = section(&out);
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>()[..6],
        ["llm", "(run", "7)", "1000", "running", "2/2"]
    );
    assert!(lines[1].trim_end().ends_with(" -"), "{out}");
    assert_eq!(
        lines[2..],
        [
            "  memory: peaks 3.5 GiB-3.5 GiB (highest rank 0), headroom -512.0 MiB (rank 0), OOM in ~4m (rank 1)",
            "  leak on 2 of 2 ranks (0,1): allocated floor grows 8.0 MiB/step",
            "  conflict: rank 1 claimed by two processes: s-2 (pid 4101) and s-9 (pid 77)",
        ],
        "{out}"
    );
}

#[test]
fn a_job_s_strings_are_escaped_like_every_other_string() {
    let v = leaking(
        "evil\u{1b}[2J\u{1b}]0;x\u{7}",
        "r\nFORGED ROW",
        "gro\u{202e}yp.org\r\nJOB forged",
    );
    let out = table(&node(vec![v]), &origin());
    assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
    assert!(!out.contains('\u{202e}'), "{out:?}");
    assert!(
        !out.lines()
            .any(|l| l.starts_with("FORGED") || l.starts_with("JOB forged")),
        "{out}"
    );
    // The header, the row and its three lines: nothing split into more.
    assert_eq!(section(&out).len(), 5, "{out}");
}

/// `gpumon status --json` writes the snapshot: its `jobs` carry the verdict's fields.
#[test]
fn the_json_output_carries_the_jobs() {
    let v: serde_json::Value = serde_json::to_value(node(vec![failed()])).unwrap();
    let j = &v["jobs"][0];
    assert_eq!(j["job"], "train-ddp");
    assert_eq!(j["run_id"], "r-42");
    assert_eq!(j["state"], "failed");
    assert_eq!(j["first_failure"]["rank"], 2);
    assert_eq!(j["first_failure"]["kind"], "oom");
    assert_eq!(j["consequences"].as_array().map(Vec::len), Some(3));
    assert_eq!(j["memory"]["peak_max_rank"], 2);
}

#[test]
fn two_users_runs_of_one_name_and_run_id_are_two_rows_told_apart_by_uid() {
    let mut root = failed();
    root.uid = Some(0);
    let out = table(&node(vec![failed(), root]), &origin());
    let rows: Vec<&str> = section(&out)
        .into_iter()
        .filter(|l| l.starts_with("train-ddp"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert_ne!(rows[0], rows[1], "{out}");
    let uid = |l: &str| l.split_whitespace().nth(3).map(str::to_string);
    let mut uids: Vec<String> = rows.iter().filter_map(|l| uid(l)).collect();
    uids.sort();
    assert_eq!(uids, ["0", "1000"], "{out}");
}

#[test]
fn a_stopped_job_says_it_was_stopped_and_by_which_signal() {
    let members = (0..2)
        .map(|r| {
            let mut m = member(r, Some((Kind::Stopped, 0.1 * r as f64)));
            if let Some(f) = m.failure.as_mut() {
                f.message = "the trainer was stopped by SIGINT at step 812".into();
                f.signal = Some("SIGINT".into());
            }
            m
        })
        .collect();
    let out = table(&node(vec![job("train-ddp", "r-7", 2, members)]), &origin());
    let lines = section(&out);
    let row = lines.iter().find(|l| l.starts_with("train-ddp")).unwrap();
    assert!(row.contains(" stopped "), "{out}");
    assert!(
        row.contains("stopped: rank 0 by SIGINT on node-a at step 812, then 1 rank within 0.1 s"),
        "{out}"
    );
    assert!(!out.contains("failed"), "{out}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("rank 0 stopped: the trainer was stopped by SIGINT")),
        "{out}"
    );
}

#[test]
fn the_exception_a_rank_died_of_is_named_and_reaches_the_terminal_escaped() {
    let mut ms: Vec<Member> = (0..2)
        .map(|r| member(r, Some((Kind::Crash, r as f64))))
        .collect();
    if let Some(f) = ms[0].failure.as_mut() {
        f.exception = Some("RuntimeError: boom\u{1b}[2J".into());
    }
    let out = table(&node(vec![job("train-ddp", "r-8", 2, ms)]), &origin());
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(
        out.contains("failed: rank 0 crash (RuntimeError: boom\\u{1b}[2J)"),
        "{out}"
    );
}

#[test]
fn a_failure_past_the_cascade_window_is_said_in_the_cores_words() {
    // Rank 0's OOM, rank 1 down 1.5 s later, rank 2 95 s later: past the 60 s window.
    let after = [0.0, 1.5, 95.0];
    let members = (0..3)
        .map(|r| {
            let kind = if r == 0 { Kind::Oom } else { Kind::Crash };
            member(r, Some((kind, after[r as usize])))
        })
        .collect();
    let v = job("train-ddp", "r-42", 3, members);
    assert_eq!(v.other_failures.len(), 1, "{v:#?}");
    let out = table(&node(vec![v.clone()]), &origin());
    let want = crate::core::jobs::text::later_failures(&v.other_failures, 8).unwrap();
    assert_eq!(want, "failed past the cascade window: rank 2 crash +1m");
    assert!(
        section(&out).contains(&format!("  {want}").as_str()),
        "{out}"
    );
}
