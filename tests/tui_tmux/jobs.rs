//! One job over two daemons (two nodes on one machine, `--node-name`), 4 ranks on each, and
//! `gpumon tui --connect A --connect B` showing it as one: rank 5 on node-b runs out of
//! memory, the other 7 are taken down after it (node-a's a second later, past the clock
//! tolerance), and the TUI names rank 5 where node-a's daemon, on its own, blames its own
//! first crash.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::common::*;
use super::tmux::Tmux;

const GIB: u64 = 1 << 30;

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn node(name: &str) -> Daemon {
    Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec!["--node-name".into(), name.into()]),
        ..DaemonOpts::default()
    })
}

/// A rank of run `run-7`: hello, then 20 steps of samples (the trainer's clock, the last now).
fn rank(d: &Daemon, rank: u64) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(
        s,
        r#"{{"type":"hello","v":1,"pid":{},"job":"llama","run_id":"run-7","rank":{rank},"world_size":8,"gpu_uuid":"GPU-{rank}"}}"#,
        200 + rank
    )
    .unwrap();
    let mut welcome = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    let t0 = unix_now() - 20.0;
    let mut out = String::new();
    for step in 1..=20u64 {
        out.push_str(&format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{},\"allocated_bytes.all.peak\":{},\"reserved_bytes.all.current\":{}}},\"device_free\":{},\"device_total\":{}}}\n",
            t0 + step as f64,
            20 * GIB,
            (30 + rank) * GIB,
            40 * GIB,
            40 * GIB,
            80 * GIB,
        ));
    }
    s.write_all(out.as_bytes()).unwrap();
    s
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn first_failure_rank(d: &Daemon) -> Option<u64> {
    let snap = d.snapshot();
    let jobs = snap["jobs"].as_array()?;
    let job = jobs.iter().find(|j| j["run_id"] == "run-7")?;
    job["first_failure"]["rank"].as_u64()
}

#[test]
fn two_daemons_show_one_job_and_its_first_failure_across_them() {
    let Some(tmux) = Tmux::start() else { return };
    let config = empty_config();
    let a = node("node-a");
    let b = node("node-b");
    let mut ranks: Vec<(u64, UnixStream)> = (0..4).map(|r| (r, rank(&a, r))).collect();
    ranks.extend((4..8).map(|r| (r, rank(&b, r))));
    let (addr_a, addr_b) = (a.addr.to_string(), b.addr.to_string());
    tmux.tui(
        "jobs",
        config.path(),
        &[],
        &[
            "--connect",
            &addr_a,
            "--connect",
            &addr_b,
            "--refresh",
            "200ms",
        ],
    );
    // One job over both nodes, its 8 ranks in under it.
    let pane = tmux.wait_all(
        "jobs",
        &[
            &format!(
                "■ llama (run run-7, uid {}) · 8/8 ranks on node-a, node-b · running",
                euid()
            ),
            "llama r0/8",
            "llama r7/8",
        ],
    );
    assert_eq!(pane.matches("■ llama").count(), 1, "{pane}");

    // Rank 5 (node-b) runs out of memory and dies without bye; node-b's other ranks go 0.3 s
    // later, node-a's a second after that.
    let mut five = ranks.remove(5).1;
    writeln!(
        five,
        r#"{{"type":"event","ts":{},"kind":"oom","alloc_bytes":{},"device_free":104857600,"detail":"CUDA out of memory. Tried to allocate 2.00 GiB"}}"#,
        unix_now(),
        2 * GIB
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(five);
    std::thread::sleep(Duration::from_millis(300));
    let (on_a, on_b): (Vec<_>, Vec<_>) = ranks.into_iter().partition(|(r, _)| *r < 4);
    drop(on_b);
    std::thread::sleep(Duration::from_millis(1000));
    drop(on_a);

    let pane = tmux.wait_all(
        "jobs",
        &[
            "8/8 ranks on node-a, node-b · failed",
            "✗ failed: rank 5 oom on node-b at step 20, then 7 ranks within",
            "↳ followed: 7 ranks (0-4,6,7) crashed within",
        ],
    );
    assert_eq!(pane.matches("■ llama").count(), 1, "{pane}");
    assert!(!pane.contains("order unknown"), "{pane}");
    // On its own, node-a's daemon can only blame one of its own ranks.
    a.wait_for(Duration::from_secs(10), "node-a's verdict", || {
        first_failure_rank(&a).is_some()
    });
    assert!(first_failure_rank(&a).is_some_and(|r| r < 4));
    assert_eq!(first_failure_rank(&b), Some(5));

    tmux.keys("jobs", &["q"]);
    assert_eq!(tmux.wait_exit("jobs"), 0);
    tmux.assert_restored("jobs");
}

/// A user who opens (llama, run-7) first does not get root's ranks of it: the TUI shows two
/// jobs, told apart by their uid, each with its own ranks and state.
#[test]
fn two_users_runs_of_one_name_and_run_id_are_two_jobs_on_screen() {
    use super::identity::{as_uid, connect, is_root, OTHER};
    if !is_root() {
        return;
    }
    let Some(tmux) = Tmux::start() else { return };
    let config = empty_config();
    // One node with GPUs: the Overview lists trainers under its GPUs.
    let two_gpus = scenario("two_gpus");
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&two_gpus),
        ..DaemonOpts::default()
    });
    let socket = d.socket.clone();
    let mut bait = as_uid(OTHER, move || connect(&socket, "llama", "run-7", 0, 2, ""));
    bait.steps(5);
    let mut root: Vec<_> = (0..2)
        .map(|r| connect(&d.socket, "llama", "run-7", r, 2, ""))
        .collect();
    for r in &mut root {
        r.steps(5);
    }
    let addr = d.addr.to_string();
    tmux.tui(
        "identity",
        config.path(),
        &[],
        &["--connect", &addr, "--refresh", "200ms"],
    );
    let pane = tmux.wait_all(
        "identity",
        &[
            "■ llama (run run-7, uid 0) · 2/2 ranks · running",
            &format!("■ llama (run run-7, uid {OTHER}) · 1/2 ranks · running"),
        ],
    );
    assert_eq!(pane.matches("■ llama").count(), 2, "{pane}");
    // The bait crashes: its job fails, root's runs on.
    drop(bait);
    tmux.wait_all(
        "identity",
        &[
            "■ llama (run run-7, uid 0) · 2/2 ranks · running",
            &format!("■ llama (run run-7, uid {OTHER}) · 1/2 ranks · failed"),
        ],
    );
    tmux.keys("identity", &["q"]);
    assert_eq!(tmux.wait_exit("identity"), 0);
    drop(root);
}
