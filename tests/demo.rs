//! `gpumon demo --headless` as a newcomer runs it: URL and socket on the first lines, the leak
//! flagged within about a minute and named down to the line, near_limit on the near-limit
//! trainer, the simulated NVML listing the trainer children with the memory they report, the
//! leak's OOM and restart telling one story, the job's rank 2 failing first and taking the other
//! three ranks down, and no child left behind. tests/demo/trainer.rs runs one demo trainer alone
//! against a socket the test serves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "demo/trainer.rs"]
mod trainer;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::get;
use gpumon::frontends::demo::job;
use gpumon::frontends::demo::profile::Profile;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// A `gpumon demo --headless` child: its URL and socket, read from its first lines.
struct Demo {
    child: Child,
    url: String,
    socket: String,
    started: Instant,
}

impl Demo {
    fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(["demo", "--headless", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env("GPUMON_CONFIG", "/dev/null")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL on the first line: {first:?}"))
            .to_string();
        let mut second = String::new();
        out.read_line(&mut second).unwrap();
        let socket = second.strip_prefix("socket: ").unwrap().trim().to_string();
        assert!(Path::new(&socket).exists(), "{socket}");
        Self {
            child,
            url,
            socket,
            started: Instant::now(),
        }
    }

    fn snap(&self) -> Value {
        serde_json::from_str(&get(&format!("{}/api/v1/snapshot", self.url)).1).unwrap()
    }

    /// Polls the snapshot until `done` holds, failing after `limit` seconds since the start.
    fn until(&self, limit: u64, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        loop {
            let s = self.snap();
            if done(&s) {
                println!(
                    "{what}: {:.1} s after start",
                    self.started.elapsed().as_secs_f64()
                );
                return s;
            }
            assert!(
                self.started.elapsed() < Duration::from_secs(limit),
                "not {what} after {limit} s: {}",
                s["findings"]
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// SIGTERM: the demo stops its daemon and its children, and removes its scratch dir.
    fn stop(mut self, pids: &[u64]) {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        assert!(self.child.wait().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids.iter().any(|p| alive(*p)) {
            assert!(Instant::now() < deadline, "children still alive: {pids:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            !Path::new(&self.socket).exists(),
            "the demo's scratch dir is removed"
        );
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // A failed test still takes its demo down (and the demo its children); once reaped,
        // its pid is no longer ours to signal.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe {
                libc::kill(self.child.id() as i32, libc::SIGTERM);
            }
            let _ = self.child.wait();
        }
    }
}

/// "1018.0 MiB" in bytes.
fn bytes_of(text: &str) -> Option<u64> {
    let (n, unit) = text.trim().split_once(' ')?;
    let scale = match unit {
        "KiB" => 1u64 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    Some((n.parse::<f64>().ok()? * scale as f64) as u64)
}

fn findings<'a>(s: &'a Value, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    s["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(move |f| f["kind"] == kind)
}

fn firing(s: &Value, kind: &str, job: &str) -> bool {
    findings(s, kind).any(|f| f["state"] == "firing" && f["job"] == job)
}

/// The demo's leak finding names train.py:27, from the leaking trainer's own answer.
fn leak_named(s: &Value) -> bool {
    findings(s, "leak").any(|f| {
        let top = &f["attribution"]["sites"][0];
        f["job"] == "demo-leak"
            && top["file"] == "/home/alice/proj/train.py"
            && top["line"] == 27
            && top["function"] == "kept_outputs"
    })
}

#[test]
fn the_demo_flags_the_leak_within_a_minute_names_its_line_and_cleans_up() {
    let demo = Demo::start(&[]);
    let s = demo.until(90, "leak and near_limit firing", |s| {
        firing(s, "leak", "demo-leak") && firing(s, "near_limit", "demo-near-limit")
    });
    assert!(
        !firing(&s, "leak", "demo-healthy"),
        "the healthy trainer is not a leak"
    );
    // The near-limit trainer says where its memory goes (step 3): its near_limit finding gives
    // the batch that fits, and so does its session in the API.
    let near = findings(&s, "near_limit")
        .find(|f| f["job"] == "demo-near-limit")
        .unwrap();
    let hint = near["hint"].as_str().unwrap_or("");
    assert!(hint.contains("a batch of 14 fits (now 16;"), "{near}");
    assert!(
        near["message"]
            .as_str()
            .is_some_and(|m| m.contains("where the memory went: parameters 12.0 GiB")),
        "{near}"
    );
    let session = |s: &Value, job: &str| {
        s["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["job"] == job && x["ended"].is_null())
            .cloned()
            .unwrap_or_else(|| panic!("no live {job} session"))
    };
    let near = session(&s, "demo-near-limit");
    assert_eq!(near["largest_safe_batch"], 14, "{}", near["batch_fit"]);
    assert_eq!(
        near["categories"]["batch_size"], 16,
        "{}",
        near["categories"]
    );
    assert!(session(&s, "demo-healthy")["largest_safe_batch"].is_null());
    // `gpumon status` shows each trainer's open findings on its row, and their messages.
    let out = Command::new(BIN)
        .args(["status", "--connect", &demo.url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let row = |job: &str| {
        table
            .lines()
            .find(|l| l.starts_with(job))
            .unwrap_or_else(|| panic!("no {job} row: {table}"))
            .to_string()
    };
    assert!(row("demo-leak ").contains("leak firing"), "{table}");
    assert!(
        row("demo-near-limit").contains("near_limit firing"),
        "{table}"
    );
    assert!(row("demo-healthy").trim_end().ends_with('-'), "{table}");
    assert!(
        table.contains("demo-leak leak: allocated floor grows"),
        "{table}"
    );

    // Each trainer is a real child whose pid the simulated NVML lists, with the memory it reports
    // (reserved + a 512 MiB CUDA context), joined to its session. The job's four ranks live
    // until 75 s in, and may have died by now.
    let all = s["sessions"].as_array().unwrap();
    let sessions: Vec<&Value> = all.iter().filter(|x| x["job"] != job::JOB).collect();
    assert_eq!(sessions.len(), 4);
    assert_eq!(all.len(), 8, "the job's four ranks");
    let mut pids = Vec::new();
    for sess in &sessions {
        let pid = sess["pid"].as_u64().unwrap();
        pids.push(pid);
        assert!(alive(pid));
        let nvml = sess["nvml"]["used_memory_bytes"].as_f64().unwrap();
        let reserved = sess["stats"]["reserved"].as_f64().unwrap();
        // The untracked trainer holds more outside its allocator as it goes.
        let step = sess["step"].as_u64().unwrap_or(0);
        let profile = match sess["job"].as_str() {
            Some("demo-untracked") => Profile::Untracked,
            _ => Profile::Healthy,
        };
        let expected = reserved + 512.0 * 1048576.0 + profile.outside_growth(step);
        // The ledger says the same: what lies outside is NVML's figure less reserved.
        let outside = sess["ledger"]["outside_allocator_bytes"].as_f64().unwrap();
        assert!(
            (outside - (nvml - reserved)).abs() < 1.0,
            "{}",
            sess["ledger"]
        );
        // The leak moves 40 MiB/s between the two reads: allow a few seconds of it.
        assert!(
            (nvml - expected).abs() < 512.0 * 1048576.0,
            "{}: nvml {nvml} vs reserved+context {expected}",
            sess["job"]
        );
    }
    let gpus = s["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);

    // The daemon asks the leaking trainer where its memory grows; the answer (one recorded step,
    // then 20 steps at 5 a second) lands on the finding a few seconds later.
    let s = demo.until(120, "leak named at train.py:27", leak_named);
    let a = &findings(&s, "leak")
        .find(|f| f["job"] == "demo-leak")
        .unwrap()["attribution"];
    let per_step = Profile::Leak.leak_per_step().unwrap();
    let steps = a["step_to"].as_u64().unwrap() - a["step_from"].as_u64().unwrap();
    assert_eq!(
        a["sites"][0]["bytes"].as_u64(),
        Some(steps * per_step),
        "{a}"
    );

    // The untracked trainer's allocator is flat while memory outside it grows: found by the
    // ledger's trend, named for what it is, and no leak.
    let s = demo.until(150, "untracked_growth firing for demo-untracked", |s| {
        firing(s, "untracked_growth", "demo-untracked")
    });
    assert!(!firing(&s, "leak", "demo-untracked"));
    let f = findings(&s, "untracked_growth")
        .find(|f| f["job"] == "demo-untracked")
        .unwrap();
    // 4 MiB/step, as the fit sees it: NVML's figure pairs with a sample up to a poll apart, so
    // on a busy machine the slope can read 3.9 or 4.1.
    let slope = f["evidence"]["slope_bytes_per_step"].as_f64().unwrap();
    assert!(
        (slope / (4.0 * 1048576.0) - 1.0).abs() < 0.05
            && f["message"]
                .as_str()
                .unwrap()
                .starts_with("memory outside PyTorch's allocator grows "),
        "{f}"
    );
    for job in ["demo-healthy", "demo-leak", "demo-near-limit"] {
        assert!(!firing(&s, "untracked_growth", job), "{job}");
    }
    // By now (over 50 s in) the near-limit trainer's first epoch ended on a short batch, measured
    // once: the fit has two batch sizes, and the latest split is the full batch again.
    let near = session(&s, "demo-near-limit");
    assert_eq!(
        near["batch_fit"]["basis"], "fitted",
        "{}",
        near["batch_fit"]
    );
    assert_eq!(
        near["batch_fit"]["batch_sizes"],
        serde_json::json!([10, 16])
    );
    assert_eq!(near["categories"]["batch_size"], 16);
    assert_eq!(near["largest_safe_batch"], 14);
    // /metrics says the same, by category.
    let metrics = get(&format!("{}/metrics", demo.url)).1;
    let near_series = |name: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && l.contains("job_name=\"demo-near-limit\""))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let split = near_series("gpumon_trainer_memory_bytes{");
    assert_eq!(split.len(), 6, "{split:?}");
    assert!(
        split
            .iter()
            .any(|l| l.contains("category=\"parameters\"") && l.ends_with(" 12884901888")),
        "{split:?}"
    );
    let safe = near_series("gpumon_trainer_largest_safe_batch{");
    assert!(safe.len() == 1 && safe[0].ends_with(" 14"), "{safe:?}");

    // Ctrl-C on the demo's terminal reaches every trainer too: one stopped so says bye, and its
    // session ends clean, not as a crash.
    let healthy = sessions
        .iter()
        .find(|x| x["job"] == "demo-healthy")
        .and_then(|x| x["pid"].as_u64())
        .unwrap();
    // SAFETY: kill(2) on the demo's own child, alive (checked above).
    unsafe {
        libc::kill(healthy as i32, libc::SIGINT);
    }
    // `until` counts from the demo's start: the growth above may take up to 150 s.
    let s = demo.until(165, "the healthy trainer's session ended", |s| {
        s["sessions"].as_array().is_some_and(|v| {
            v.iter()
                .any(|x| x["job"] == "demo-healthy" && !x["ended"].is_null())
        })
    });
    let ended = s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["job"] == "demo-healthy")
        .unwrap();
    assert_eq!(ended["ended"][1], "clean", "{}", ended["ended"]);
    assert!(!findings(&s, "crash").any(|f| f["job"] == "demo-healthy"));

    demo.stop(&pids);
}

#[test]
fn the_demo_s_oom_says_what_its_samples_said_and_its_restart_clears_the_crash() {
    // Start late enough in the leak's run that it meets the limit 95 s in: after its leak is
    // flagged (~70 s in) and named, as in the 17th minute of a plain `gpumon demo`.
    let skip = Profile::Leak.period().unwrap() - 95.0;
    let demo = Demo::start(&["--skip", &format!("{skip:.3}")]);
    demo.until(90, "leak named", leak_named);
    let restarted = |s: &Value| {
        let leak: Vec<&Value> = s["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["job"] == "demo-leak")
            .collect();
        leak.len() == 2 && leak.iter().any(|x| x["ended"].is_null())
    };
    let s = demo.until(130, "OOM and restart", restarted);
    let sessions = s["sessions"].as_array().unwrap();
    let old = sessions
        .iter()
        .find(|x| x["job"] == "demo-leak" && !x["ended"].is_null())
        .unwrap();
    assert_eq!(old["ended"][1], "crash", "{}", old["ended"]);
    let events = old["events"].as_array().unwrap();
    let oom = events.iter().find(|e| e["kind"] == "oom").unwrap();
    // The OOM saw the free memory its last sample saw (within one step's change: the leak's
    // 8 MiB and the floor's jitter), and too little for the allocation.
    let free = oom["device_free"].as_u64().unwrap();
    let seen = old["device_free"].as_u64().unwrap();
    println!("OOM with {free} free; the last sample saw {seen}");
    assert!(free.abs_diff(seen) <= 72 << 20, "{free} vs {seen}");
    assert!(free < oom["alloc_bytes"].as_u64().unwrap());
    assert!(events.iter().any(|e| e["kind"] == "mark"
        && e["detail"]
            .as_str()
            .unwrap()
            .starts_with("trainer died: OutOfMemoryError")));
    // The OOM counts, though no sample lived to report it.
    assert_eq!(old["ooms_total"], 1, "{old}");
    let session = old["session"].as_str().unwrap();
    // The finding a newcomer reads says the same: "tried to allocate 2.0 GiB with X free".
    let oom_finding = findings(&s, "oom")
        .find(|f| f["session"] == session)
        .unwrap();
    let message = oom_finding["message"].as_str().unwrap();
    let said = message
        .split(" with ")
        .nth(1)
        .and_then(|t| t.split(" free").next())
        .and_then(bytes_of)
        .unwrap_or_else(|| panic!("no free memory in {message:?}"));
    assert!(said.abs_diff(free) < 1 << 20, "{message:?} vs {free}");
    // The trainer came back in the same process: its crash is over, nothing critical is firing
    // beside the live new session.
    let crash = findings(&s, "crash")
        .find(|f| f["session"] == session)
        .unwrap();
    assert_eq!(crash["state"], "resolved", "{crash}");
    assert!(!findings(&s, "crash").any(|f| f["state"] == "firing"));

    let pids: Vec<u64> = sessions.iter().filter_map(|x| x["pid"].as_u64()).collect();
    demo.stop(&pids);
}

#[test]
fn the_demo_records_traces_for_gpumon_analyze() {
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces");
    let d = Demo::start(&["--record-dir", traces.to_str().unwrap()]);
    // With samples, and NVML's figure joined to each (a poll can lag on a busy machine): the
    // trace notes the figure before the next sample.
    d.until(30, "eight trainers with samples and NVML's figure", |s| {
        s["sessions"].as_array().is_some_and(|v| {
            v.len() == 8
                && v.iter().all(|t| {
                    t["samples"].as_u64() > Some(5)
                        && t["ledger"]["outside_allocator_bytes"].is_u64()
                })
        })
    });
    std::thread::sleep(Duration::from_secs(1));
    // `gpumon status` lists the job, then the trainers by job.
    let out = Command::new(BIN)
        .args(["status", "--connect", &d.url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let jobs: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("demo-"))
        .collect();
    assert_eq!(
        jobs,
        [
            "demo-ddp",
            "demo-ddp",
            "demo-ddp",
            "demo-ddp",
            "demo-ddp",
            "demo-healthy",
            "demo-leak",
            "demo-near-limit",
            "demo-untracked"
        ],
        "{table}"
    );
    let row = table.lines().find(|l| l.starts_with("demo-ddp (run ddp-"));
    assert!(
        row.is_some_and(|r| r.contains(" running ") && r.contains(" 4/4 ")),
        "{table}"
    );
    // SAFETY: kill(2) on our own child; the demo ends its sessions and writes out the traces.
    unsafe {
        libc::kill(d.child.id() as i32, libc::SIGTERM);
    }
    let files: Vec<_> = std::fs::read_dir(&traces)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".trace.jsonl"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while files
        .iter()
        .any(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0) == 0)
    {
        assert!(Instant::now() < deadline, "empty traces: {files:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(files.len(), 8, "{files:?}");
    // Each trace notes NVML's figure for its process, which analyze pairs its samples with.
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.contains(r#""type":"trace_nvml","used_bytes":"#),
            "{f:?}"
        );
    }
    drop(d);
    let out = Command::new(BIN)
        .args(["analyze", "--format", "json"])
        .args(&files)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["traces"].as_array().map(Vec::len),
        Some(8),
        "{report}"
    );
    // The ranks' traces make one job again, stopped with the demo: no failure.
    let ddp = report["jobs"]
        .as_array()
        .and_then(|v| v.iter().find(|j| j["job"] == job::JOB))
        .unwrap_or_else(|| panic!("no {} job in {}", job::JOB, report["jobs"]));
    assert_eq!(ddp["ranks"], serde_json::json!([0, 1, 2, 3]), "{ddp}");
    assert!(ddp["first_failure"].is_null(), "{ddp}");
}

/// The API's entry of the demo's job.
fn ddp(s: &Value) -> Option<&Value> {
    s["jobs"].as_array()?.iter().find(|j| j["job"] == job::JOB)
}

#[test]
fn the_demo_s_job_fails_at_rank_2_s_oom_and_takes_the_other_three_down() {
    // Rank 2 runs out of memory 15 s after the start.
    let skip = job::FAIL_AT - 15.0;
    let demo = Demo::start(&["--skip", &format!("{skip:.3}")]);
    let s = demo.until(60, "the job failed, three ranks after rank 2", |s| {
        ddp(s).is_some_and(|j| {
            j["state"] == "failed" && j["consequences"].as_array().map(Vec::len) == Some(3)
        })
    });
    let j = ddp(&s).unwrap();
    assert_eq!(j["world_size"], 4, "{j}");
    assert_eq!(j["ranks"], serde_json::json!([0, 1, 2, 3]), "{j}");
    assert!(j["run_id"].as_str().unwrap().starts_with("ddp-"), "{j}");
    let first = &j["first_failure"];
    assert_eq!(
        (&first["rank"], &first["kind"]),
        (&2.into(), &"oom".into()),
        "{j}"
    );
    // At the step the OOM cut short (5 steps a second).
    let step = first["step"].as_u64().unwrap();
    let at = (job::FAIL_AT * 5.0) as u64;
    assert!((at - 5..=at).contains(&step), "{step}");
    let mut followed: Vec<u64> = Vec::new();
    for c in j["consequences"].as_array().unwrap() {
        assert_eq!(c["kind"], "crash", "{c}");
        let after = c["after_seconds"].as_f64().unwrap();
        // 1.2 to 1.8 s, and what a busy machine adds to a process's exit.
        assert!((0.9..6.0).contains(&after), "{c}");
        followed.push(c["rank"].as_u64().unwrap());
    }
    followed.sort_unstable();
    assert_eq!(followed, [0, 1, 3]);

    // One page: rank 2's OOM is the only critical finding of the job still firing; the
    // others' crashes are warnings that name it.
    let ours: Vec<&Value> = s["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["job"] == job::JOB && f["state"] == "firing")
        .collect();
    let critical: Vec<&&Value> = ours
        .iter()
        .filter(|f| f["severity"] == "critical")
        .collect();
    assert_eq!(critical.len(), 1, "{ours:#?}");
    assert_eq!(critical[0]["kind"], "oom");
    assert_eq!(critical[0]["session"], first["session"]);
    let crashes: Vec<&&Value> = ours
        .iter()
        .filter(|f| f["kind"] == "crash" && f["session"] != first["session"])
        .collect();
    assert_eq!(crashes.len(), 3, "{ours:#?}");
    for c in crashes {
        assert_eq!(c["severity"], "warning", "{c}");
        assert_eq!(c["consequence_of"]["rank"], 2, "{c}");
    }

    // `gpumon status` gives the verdict in one line.
    let out = Command::new(BIN)
        .args(["status", "--connect", &demo.url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("demo-ddp (run ddp-"))
        .unwrap_or_else(|| panic!("no job row: {table}"));
    assert!(
        row.contains(" failed ")
            && row.contains("failed: rank 2 oom")
            && row.contains(", then 3 ranks within "),
        "{table}"
    );
    println!("{table}");

    // The ranks' processes are gone, and the simulated NVML lists them no more.
    let ranks: Vec<u64> = s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["job"] == job::JOB)
        .filter_map(|x| x["pid"].as_u64())
        .collect();
    assert_eq!(ranks.len(), 4);
    assert!(ranks.iter().all(|p| !alive(*p)), "{ranks:?}");
    let s = demo.until(90, "NVML without the ranks", |s| {
        s["processes"].as_array().is_some_and(|v| {
            !v.iter()
                .any(|p| p["pid"].as_u64().is_some_and(|p| ranks.contains(&p)))
        })
    });
    let pids: Vec<u64> = s["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["pid"].as_u64())
        .collect();
    demo.stop(&pids);
}
