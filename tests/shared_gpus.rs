//! Shared GPUs through the real daemon on the fake NVML library: one process on two GPUs stays
//! two rows, one per (process, GPU), each with that GPU's figure, and its trainer session joins
//! the GPU its hello names; a GPU under MPS lists its server (a compute process) and its clients
//! (NVML's MPS compute list only), each charged to the container of the pid NVML gives, and a
//! client whose memory NVML does not give is "n/a" everywhere, never a share of the server's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const GPU0: &str = "GPU-5a5a0000-0000-4000-8000-000000000000";
const GPU1: &str = "GPU-5a5a0001-0000-4000-8000-000000000000";
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const SERVER: u32 = 7300;
const CLIENT: u32 = 7301;
/// An MPS client whose memory NVML gives as "n/a".
const CLIENT_NA: u32 = 7302;

/// The container id docker's cgroup v2 scope names, as `container` shows it (12 hex digits).
fn container(n: u32) -> String {
    format!("{n:012x}")
}

/// A /proc with each process in its own docker container.
fn procfs(dir: &Path, me: u32) {
    std::fs::write(dir.join("stat"), "cpu 0 0 0 0 0 0 0 0 0 0\n").unwrap();
    for (pid, name) in [
        (me, "python"),
        (SERVER, "nvidia-cuda-mps"),
        (CLIENT, "python"),
        (CLIENT_NA, "python"),
    ] {
        let p = dir.join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("comm"), format!("{name}\n")).unwrap();
        std::fs::write(
            p.join("status"),
            format!(
                "Name:\t{name}\nState:\tS (sleeping)\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\n"
            ),
        )
        .unwrap();
        let id = format!("{}{}", container(pid), "0".repeat(52));
        std::fs::write(
            p.join("cgroup"),
            format!("0::/system.slice/docker-{id}.scope\n"),
        )
        .unwrap();
    }
}

/// GPU 0 and GPU 1 share the test's process (8 and 12 GiB); GPU 1 also runs MPS.
fn scenario_file(dir: &Path, me: u32) -> PathBuf {
    let gpu = |uuid: &str| {
        format!("\n[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nuuid = \"{uuid}\"\nmemory_total = 85520809984\n")
    };
    let process = |pid: u32, kind: &str, used: &str| {
        format!("\n[[gpu.process]]\npid = {pid}\nkind = \"{kind}\"\nused = {used}\n")
    };
    let mut s = String::from("driver_version = \"580.95.05\"\n");
    s.push_str(&gpu(GPU0));
    s.push_str(&process(me, "compute", &(8 * GIB).to_string()));
    s.push_str(&gpu(GPU1));
    s.push_str(&process(me, "compute", &(12 * GIB).to_string()));
    s.push_str(&process(SERVER, "compute", &(500 * MIB).to_string()));
    s.push_str(&process(CLIENT, "mps", &(6 * GIB).to_string()));
    s.push_str(&process(CLIENT_NA, "mps", "\"n/a\""));
    let path = dir.join("shared.toml");
    std::fs::write(&path, s).unwrap();
    path
}

fn rows(snap: &serde_json::Value, pid: u32) -> Vec<serde_json::Value> {
    let mut found: Vec<serde_json::Value> = snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == pid)
        .cloned()
        .collect();
    found.sort_by_key(|p| p["gpu"].as_u64());
    found
}

#[test]
fn one_process_on_two_gpus_and_mps_clients_each_keep_their_rows() {
    let me = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    let proc_dir = dir.path().join("proc");
    std::fs::create_dir_all(&proc_dir).unwrap();
    procfs(&proc_dir, me);
    let path = scenario_file(dir.path(), me);
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&path),
        args: DaemonOpts::default_args_and(vec!["--procfs".into(), proc_dir.display().to_string()]),
        ..DaemonOpts::default()
    });

    // The trainer on GPU 1 (its hello names it), the same process as on GPU 0.
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    writeln!(
        w,
        r#"{{"type":"hello","v":1,"pid":1,"job":"two","rank":0,"gpu_uuid":"{GPU1}"}}"#
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.contains("welcome"), "{line}");
    writeln!(
        w,
        r#"{{"type":"sample","ts":1763700000,"step":1,"stats":{{"allocated_bytes.all.current":{},"reserved_bytes.all.current":{}}}}}"#,
        8 * GIB,
        10 * GIB
    )
    .unwrap();
    d.wait_for(Duration::from_secs(10), "the session's NVML figure", || {
        d.snapshot()["sessions"][0]["nvml"]["used_memory_bytes"].is_u64()
    });

    // Two rows for the one process, each with its GPU's figure; the session joins GPU 1's.
    let snap = d.snapshot();
    let mine = rows(&snap, me);
    assert_eq!(mine.len(), 2, "{mine:?}");
    let got: Vec<(u64, &str, u64)> = mine
        .iter()
        .map(|p| {
            (
                p["gpu"].as_u64().unwrap(),
                p["uuid"].as_str().unwrap(),
                p["used_memory_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, vec![(0, GPU0, 8 * GIB), (1, GPU1, 12 * GIB)]);
    for row in &mine {
        assert_eq!(row["container"], container(me).as_str(), "{row}");
    }
    let session = &snap["sessions"][0];
    assert_eq!(session["gpu"], 1, "{session}");
    assert_eq!(
        session["nvml"]["used_memory_bytes"].as_u64(),
        Some(12 * GIB),
        "{session}"
    );
    assert_eq!(
        session["nvml"]["container"],
        container(me).as_str(),
        "{session}"
    );

    // MPS: the server a compute row, the clients "mps" rows; each charged to its own container;
    // the client NVML gives no figure for has none (null), not a share of the server's.
    let server = rows(&snap, SERVER);
    assert_eq!(server.len(), 1, "{server:?}");
    assert_eq!(server[0]["kind"], "compute");
    assert_eq!(server[0]["used_memory_bytes"].as_u64(), Some(500 * MIB));
    assert_eq!(server[0]["container"], container(SERVER).as_str());
    let client = rows(&snap, CLIENT);
    assert_eq!(client.len(), 1, "{client:?}");
    assert_eq!(
        (&client[0]["kind"], client[0]["used_memory_bytes"].as_u64()),
        (&"mps".into(), Some(6 * GIB))
    );
    assert_eq!(client[0]["container"], container(CLIENT).as_str());
    let na = rows(&snap, CLIENT_NA);
    assert_eq!(na.len(), 1, "{na:?}");
    assert_eq!(na[0]["kind"], "mps");
    assert!(na[0]["used_memory_bytes"].is_null(), "{}", na[0]);
    assert_eq!(na[0]["container"], container(CLIENT_NA).as_str());

    // /metrics: a series per (process, GPU); the n/a client has its info, no memory series.
    let m = d.metrics();
    let used = |gpu: &str, uuid: &str, pid: u32| {
        m.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "gpumon_process_memory_used_bytes{{gpu=\"{gpu}\",uuid=\"{uuid}\",pid=\"{pid}\","
                ))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(used("0", GPU0, me), Some((8 * GIB) as f64), "{m}");
    assert_eq!(used("1", GPU1, me), Some((12 * GIB) as f64), "{m}");
    assert_eq!(used("1", GPU1, CLIENT), Some((6 * GIB) as f64), "{m}");
    assert_eq!(used("1", GPU1, CLIENT_NA), None, "{m}");
    let info = m
        .lines()
        .find(|l| {
            l.starts_with("gpumon_process_info{") && l.contains(&format!("pid=\"{CLIENT_NA}\""))
        })
        .unwrap_or_else(|| panic!("{m}"));
    assert!(info.contains("kind=\"mps\""), "{info}");
    assert!(
        info.contains(&format!("container=\"{}\"", container(CLIENT_NA))),
        "{info}"
    );
    promtool_check(&m);

    // `gpumon status`: both rows of the process, the clients as mps, n/a where NVML gives none.
    let out = Command::new(BIN)
        .args(["status", "--connect", &d.url("")])
        .env_remove("GPUMON_LISTEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = |pid: u32| -> Vec<&str> {
        text.lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 2 && f[1] == pid.to_string()
            })
            .collect()
    };
    let mine = row(me);
    assert_eq!(mine.len(), 2, "{text}");
    assert!(
        mine[0].starts_with("0 ") && mine[0].ends_with("8.0 GiB"),
        "{text}"
    );
    assert!(
        mine[1].starts_with("1 ") && mine[1].ends_with("12.0 GiB"),
        "{text}"
    );
    let na = row(CLIENT_NA);
    assert_eq!(na.len(), 1, "{text}");
    assert!(na[0].contains(" mps ") && na[0].ends_with("n/a"), "{text}");
}
