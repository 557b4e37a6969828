//! Pods that got their GPU without the device plugin, through the real daemon: two through DRA
//! (a ResourceClaim; the kubelet's pod-resources API, which asks the device plugin which pod
//! holds which device, knows nothing of them) and three time-slicing one GPU. gpumon names each
//! process's pod from its cgroup (the kubelet names the cgroup after the pod's UID and the
//! container's id, however the device was allocated) and the kubelet's own /pods list, so every
//! one is labelled with its pod, namespace and container, in /metrics and in the API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use common::*;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/kubelet/podlist_dra_timesliced.json"
);

/// (pid, GPU, cgroup file) of each pod's process, as the kubelet's runtimes name the cgroups.
fn processes() -> Vec<(u32, u32, String)> {
    let v2 = |qos: &str, uid: &str, scope: &str| {
        let u = uid.replace('-', "_");
        match qos {
            "" => format!("0::/kubepods.slice/kubepods-pod{u}.slice/{scope}.scope\n"),
            q => format!(
                "0::/kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{u}.slice/{scope}.scope\n"
            ),
        }
    };
    vec![
        (7001, 1, v2("besteffort", "4f0b7c2e-8d1a-4e6b-9c3f-0a1b2c3d4e5f", "cri-containerd-4d2910e47cbe2846aed7f3cc8761c9514de04af63db6356f1091d39541e7f2be")),
        (7002, 2, v2("besteffort", "5a1c8d3f-9e2b-4f7c-8d40-1b2c3d4e5f60", "crio-e8f33b93fa2467a87ef672dafb1be5e5c5643e5bf90d5dd740dc40af904b401a")),
        (7101, 0, v2("", "6b2d9e4a-0f3c-4a8d-9e51-2c3d4e5f6071", "cri-containerd-bb3c0ca34fcecebae7462ab34ca08faacdfc6da5dbcbfe52a6dadf5a90fe4e4b")),
        // A node still on cgroup v1 with the cgroupfs driver.
        (7102, 0, "12:memory:/kubepods/pod7c3eaf5b-1a4d-4b9e-8f62-3d4e5f607182/fd9e73c0802d7ac9537b69c49bf4b096b4811d31a419a79d77e3236e6d0f6a59\n0::/\n".into()),
        (7103, 0, v2("", "8d4fb06c-2b5e-4caf-9073-4e5f60718293", "cri-containerd-3a5c3eb3c235a831e549d071e01f4eb8a2339647f5cfde227e30c6f492e56349")),
    ]
}

/// A /proc holding the pods' processes (status, stat, comm, cgroup in the kernel's formats).
fn procfs(dir: &Path) {
    std::fs::write(dir.join("stat"), "cpu 0 0 0 0 0 0 0 0 0 0\n").unwrap();
    for (pid, _, cgroup) in processes() {
        let p = dir.join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("comm"), "python\n").unwrap();
        std::fs::write(
            p.join("status"),
            "Name:\tpython\nState:\tS (sleeping)\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\n",
        )
        .unwrap();
        let fields = vec!["0"; 40].join(" ");
        std::fs::write(p.join("stat"), format!("{pid} (python) S 1 {fields}\n")).unwrap();
        std::fs::write(p.join("cgroup"), cgroup).unwrap();
    }
}

/// Three GPUs: GPU 0 time-sliced by three pods, GPUs 1 and 2 each claimed through DRA.
fn scenario_file(dir: &Path) -> std::path::PathBuf {
    let mut s = String::from("driver_version = \"580.95.05\"\n");
    for gpu in 0..3u32 {
        s.push_str(&format!(
            "\n[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nuuid = \"GPU-{gpu:08}-0000-0000-0000-000000000000\"\nmemory_total = 85520809984\n"
        ));
        for (pid, g, _) in processes() {
            if g == gpu {
                s.push_str(&format!(
                    "\n[[gpu.process]]\npid = {pid}\nname = \"python\"\nused = {}\n",
                    (pid as u64 % 100 + 1) << 30
                ));
            }
        }
    }
    let path = dir.join("pods.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// The kubelet's /pods, answering the fixture to a request with the token.
fn kubelet() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = std::fs::read(FIXTURE).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let ok =
                head.starts_with("get /pods ") && head.contains("authorization: bearer tok\r\n");
            let (status, body): (&str, &[u8]) = if ok {
                ("200 OK", &body)
            } else {
                ("401 Unauthorized", b"Unauthorized")
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(body);
        }
    });
    url
}

#[test]
fn dra_and_time_sliced_pods_are_labelled_with_their_pod_and_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let proc_dir = dir.path().join("proc");
    std::fs::create_dir(&proc_dir).unwrap();
    procfs(&proc_dir);
    let token = dir.path().join("token");
    std::fs::write(&token, "tok\n").unwrap();
    let path = scenario_file(dir.path());
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&path),
        args: DaemonOpts::default_args_and(vec![
            "--procfs".into(),
            proc_dir.to_str().unwrap().into(),
        ]),
        config: format!(
            "[kubernetes]\nkubelet_url = \"{}\"\ntoken_file = \"{}\"\n",
            kubelet(),
            token.display()
        ),
        ..DaemonOpts::default()
    });
    let want = [
        (7001, 1, "ml", "train-dra-0", "trainer"),
        (7002, 2, "ml", "train-dra-1", "trainer"),
        (7101, 0, "notebooks", "nb-alice", "notebook"),
        (7102, 0, "notebooks", "nb-bob", "notebook"),
        (7103, 0, "notebooks", "nb-carol", "notebook"),
    ];
    d.wait_for(Duration::from_secs(20), "every pod named", || {
        let m = d.metrics();
        want.iter()
            .all(|(_, _, _, pod, _)| m.contains(&format!("pod=\"{pod}\"")))
    });
    let m = d.metrics();
    for (pid, gpu, ns, pod, container) in want {
        let info = m
            .lines()
            .find(|l| {
                l.starts_with("gpumon_process_info{") && l.contains(&format!("pid=\"{pid}\""))
            })
            .unwrap_or_else(|| panic!("no gpumon_process_info for pid {pid}:\n{m}"));
        for label in [
            format!("gpu=\"{gpu}\""),
            format!("namespace=\"{ns}\""),
            format!("pod=\"{pod}\""),
            format!("container_name=\"{container}\""),
        ] {
            assert!(info.contains(&label), "{label} missing: {info}");
        }
        assert!(
            m.lines()
                .any(|l| l.starts_with("gpumon_process_memory_used_bytes{")
                    && l.contains(&format!("pid=\"{pid}\""))
                    && l.contains(&format!("pod=\"{pod}\""))),
            "pid {pid}'s memory series is not labelled with {pod}"
        );
    }
    promtool_check(&m);
    // The API says the same, one row per (process, GPU): the time-sliced GPU keeps three.
    let snap = d.snapshot();
    let procs = snap["processes"].as_array().unwrap();
    for (pid, gpu, ns, pod, _) in want {
        let p = procs
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} not in the API: {procs:#?}"));
        assert_eq!(
            (
                p["gpu"].as_u64(),
                p["namespace"].as_str(),
                p["pod"].as_str()
            ),
            (Some(gpu as u64), Some(ns), Some(pod))
        );
    }
    assert_eq!(procs.iter().filter(|p| p["gpu"] == 0).count(), 3);
}
