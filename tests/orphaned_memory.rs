//! Orphaned memory on the fake NVML, through the real daemon: NVML keeps listing memory for a
//! trainer that died (a real child of this test, left a zombie) and for a pid no /proc has; the
//! findings fire after the grace, say what the daemon knew, and clear when the memory goes. A
//! daemon whose /proc holds none of NVML's pids says so once and raises nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{sample, scenario, Daemon, DaemonOpts};
use serde_json::Value;

const GIB: u64 = 1 << 30;
const GPU1: &str = "GPU-0a0a0a0a-0000-4000-8000-000000000001";
/// When the fake NVML stops listing the dead trainer's memory (scenario seconds): after its
/// exit, the daemon's recheck of it (at most 10 s) and the grace.
const FREED_AT: f64 = 25.0;

/// A trainer as a forked child: it waits for the socket's path on a pipe, says hello as rank 3
/// of `llama-ft` and exits without bye. Nothing reaps it: a zombie of this process. Only
/// async-signal-safe calls after the fork (the test's other threads may hold malloc's lock).
struct Trainer {
    pid: i32,
    go: i32,
}

impl Trainer {
    fn fork() -> Self {
        let hello = format!(
            "{{\"type\":\"hello\",\"v\":1,\"job\":\"llama-ft\",\"rank\":3,\"world_size\":8,\"gpu_uuid\":\"{GPU1}\"}}\n"
        );
        let mut fds = [0i32; 2];
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0, "fork");
            if pid == 0 {
                libc::close(fds[1]);
                let mut addr: libc::sockaddr_un = std::mem::zeroed();
                addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
                let path = &mut addr.sun_path;
                let n = libc::read(fds[0], path.as_mut_ptr().cast(), path.len() - 1);
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if n > 0 && libc::connect(fd, (&raw const addr).cast(), len) == 0 {
                    libc::write(fd, hello.as_ptr().cast(), hello.len());
                    // Long enough for the daemon to read the hello before the close.
                    libc::usleep(300_000);
                }
                libc::_exit(0);
            }
            libc::close(fds[0]);
            Self { pid, go: fds[1] }
        }
    }

    fn connect(&mut self, socket: &std::path::Path) {
        let path = socket.as_os_str().as_encoded_bytes();
        let wrote = unsafe { libc::write(self.go, path.as_ptr().cast(), path.len()) };
        assert_eq!(wrote, path.len() as isize);
        unsafe { libc::close(self.go) };
        self.go = -1;
    }

    fn is_zombie(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.starts_with(" Z")))
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        // A test that failed before `connect` leaves the child waiting on the pipe, whose write
        // end a trainer forked by the other test may hold too: end it, or the reap waits forever.
        if self.go >= 0 {
            unsafe {
                libc::close(self.go);
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
    }
}

fn orphans(d: &Daemon) -> Vec<Value> {
    d.snapshot()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "orphaned_memory")
        .cloned()
        .collect()
}

fn of_pid(d: &Daemon, pid: i64, state: &str) -> Option<Value> {
    orphans(d)
        .into_iter()
        .find(|f| f["pid"] == pid && f["state"] == state)
}

#[test]
fn a_dead_trainer_s_memory_fires_after_the_grace_names_what_was_known_and_clears() {
    let me = std::process::id();
    let mut trainer = Trainer::fork();
    let dir = tempfile::tempdir().unwrap();
    let mut scen = std::fs::read_to_string(scenario("orphaned")).unwrap();
    // On GPU 1 (the scenario's last): this process, alive throughout, and the trainer.
    scen.push_str(&format!(
        "\n[[gpu.process]]\npid = {me}\nname = \"python\"\nused = {}\n\
         \n[[gpu.process]]\npid = {}\nname = \"python\"\nused = {}\nend = {FREED_AT}\n",
        GIB,
        trainer.pid,
        6 * GIB
    ));
    let path = dir.path().join("orphaned.toml");
    std::fs::write(&path, scen).unwrap();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&path),
        config: "[detect]\norphan_grace = \"2s\"\n".into(),
        ..DaemonOpts::default()
    });
    trainer.connect(&d.socket);
    d.wait_for(Duration::from_secs(10), "the trainer's session", || {
        d.snapshot()["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["rank"] == 3 && !s["ended"].is_null())
    });
    d.wait_for(Duration::from_secs(10), "a zombie", || trainer.is_zombie());
    let pid = i64::from(trainer.pid);
    d.wait_for(
        Duration::from_secs(20),
        "the dead trainer's finding",
        || of_pid(&d, pid, "firing").is_some(),
    );
    let f = of_pid(&d, pid, "firing").unwrap();
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!("GPU 1: 6.0 GiB held by pid {pid} (")),
        "{msg}"
    );
    assert!(msg.contains(", which exited "), "{msg}");
    assert!(msg.contains(&format!("(zombie of pid {me}")), "{msg}");
    assert!(msg.contains(", job llama-ft rank 3, session s-"), "{msg}");
    assert!(
        f["hint"].as_str().unwrap().contains(&format!("kill {me}")),
        "{f}"
    );
    assert_eq!(
        (f["gpu"].as_str(), f["rank"].as_u64()),
        (Some("1"), Some(3))
    );
    assert_eq!(f["evidence"]["orphan"]["state"], "zombie");
    assert_eq!(f["evidence"]["orphan"]["bytes"], 6 * GIB);
    assert_eq!(f["evidence"]["orphan"]["parent_pid"], me);
    let (first, since) = (
        f["first_ts"].as_f64().unwrap(),
        f["since"].as_f64().unwrap(),
    );
    assert!(
        since - first >= 2.0,
        "fired {} s after first seen",
        since - first
    );

    let snap = d.snapshot();
    let row = snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap();
    assert_eq!(
        (row["state"].as_str(), row["ppid"].as_u64()),
        (Some("zombie"), Some(u64::from(me)))
    );
    assert_eq!(row["orphaned"], true);
    assert!(snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == me)
        .all(|p| p.get("orphaned").is_none() && p.get("state").is_none()));
    // Where /proc is the host's (outside a container, or one with hostPID), the pid no /proc
    // has is orphaned too; in a container's own PID namespace only zombies are judged.
    let host = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let visible = host.to_str() == Some("pid:[4026531836]");
    let expected = if visible { "visible" } else { "partial" };
    assert_eq!(snap["host_pids"], expected);
    if visible {
        let gone = of_pid(&d, 4_194_400, "firing").expect("the gone pid's finding");
        let msg = gone["message"].as_str().unwrap();
        assert!(
            msg.starts_with("GPU 1: 19.5 GiB held by pid 4194400 (python), which exited at least "),
            "{msg}"
        );
        assert!(msg.ends_with("(no such process left)"), "{msg}");
        assert!(gone["hint"]
            .as_str()
            .unwrap()
            .contains("nvidia-smi --gpu-reset -i 1"));
    }
    // This process runs: never flagged.
    assert!(
        orphans(&d).iter().all(|f| f["pid"] != me),
        "{:#?}",
        orphans(&d)
    );

    // `gpumon status` lists it, with what to do.
    let config = common::empty_config();
    let out = std::process::Command::new(common::BIN)
        .args([
            "--config",
            config.path().to_str().unwrap(),
            "status",
            "--connect",
        ])
        .arg(d.addr.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text
        .find("ORPHANED MEMORY")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        text[at..].contains(&format!("held by pid {pid} (")),
        "{text}"
    );
    assert!(
        text[at..].contains(&format!("what to do: pid {me}")),
        "{text}"
    );

    let m = d.metrics();
    let series = format!("gpumon_orphaned_memory_bytes{{gpu=\"1\",uuid=\"{GPU1}\",pid=\"{pid}\"}}");
    assert_eq!(sample(&m, &series), Some((6 * GIB) as f64), "{m}");
    assert!(sample(&m, "gpumon_findings_firing{kind=\"orphaned_memory\"}").unwrap() >= 1.0);
    assert!(d.log_contains("orphaned_memory"), "the finding's log line");

    // The fake stops listing the memory: resolved, saying why, and its series goes.
    d.wait_for(
        Duration::from_secs_f64(FREED_AT + 10.0),
        "the memory freed",
        || of_pid(&d, pid, "resolved").is_some(),
    );
    let done = of_pid(&d, pid, "resolved").unwrap();
    assert!(done["message"]
        .as_str()
        .unwrap()
        .ends_with("; NVML no longer lists its memory"));
    assert!(of_pid(&d, pid, "firing").is_none());
    let m = d.metrics();
    assert_eq!(sample(&m, &series), None, "{m}");
    assert!(sample(&m, "gpumon_findings_total{kind=\"orphaned_memory\"}").unwrap() >= 1.0);
    common::promtool_check(&m);
}

#[test]
fn without_the_host_s_pids_it_says_so_once_and_raises_nothing() {
    // A /proc of its own, holding none of NVML's pids: as in a container without hostPID.
    let procfs = tempfile::tempdir().unwrap();
    std::fs::write(procfs.path().join("stat"), "cpu 0 0 0 0\n").unwrap();
    let path = scenario("orphaned");
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&path),
        args: DaemonOpts::default_args_and(vec![
            "--procfs".into(),
            procfs.path().to_str().unwrap().into(),
        ]),
        config: "[detect]\norphan_grace = \"1s\"\n".into(),
        ..DaemonOpts::default()
    });
    d.wait_for(Duration::from_secs(10), "host_pids", || {
        d.snapshot()["host_pids"] == "hidden"
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(orphans(&d).is_empty(), "{:#?}", orphans(&d));
    let said = d
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("none of the processes NVML lists is in /proc"))
        .count();
    assert_eq!(said, 1, "said once: {:#?}", d.logs.lock().unwrap());
    let m = d.metrics();
    assert_eq!(
        sample(&m, "gpumon_findings_total{kind=\"orphaned_memory\"}"),
        Some(0.0)
    );
}
