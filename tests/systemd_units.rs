//! The shipped systemd units: systemd's own checks on them, their sysusers/tmpfiles snippets
//! applied to a scratch root, and the daemon started the way gpumon.socket starts it (real
//! socket activation: LISTEN_FDS) serving a pushing trainer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod tools;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{get, sample, BIN};

const UNITS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd");
const INSTALLED_BIN: &str = "/usr/local/bin/gpumon";
const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";

fn unit(name: &str) -> String {
    std::fs::read_to_string(Path::new(UNITS).join(name)).unwrap()
}

/// The value of `key=` in a unit (last assignment wins, as in systemd).
fn setting<'a>(text: &'a str, key: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .collect()
}

/// The units copied to a temp dir with ExecStart pointing at the built binary: `verify` checks
/// that the command exists, and the install path does not on a build machine.
fn units_for_verify() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let service = unit("gpumon.service");
    assert!(
        service.contains(&format!("ExecStart={INSTALLED_BIN} ")),
        "the test rewrites ExecStart={INSTALLED_BIN}; update it with the unit"
    );
    std::fs::write(
        dir.path().join("gpumon.service"),
        service.replace(INSTALLED_BIN, BIN),
    )
    .unwrap();
    std::fs::write(dir.path().join("gpumon.socket"), unit("gpumon.socket")).unwrap();
    dir
}

/// (success, stderr) of `systemd-analyze verify` on the given unit files.
fn verify(files: &[PathBuf]) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(files)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn units_pass_systemd_analyze_verify() {
    if tools::find("systemd-analyze", "systemd").is_none() {
        return;
    }
    let dir = units_for_verify();
    let files = [
        dir.path().join("gpumon.service"),
        dir.path().join("gpumon.socket"),
    ];
    // verify exits 0 on unknown keys and bad values, printing a warning: stderr is the verdict.
    let (ok, stderr) = verify(&files);
    assert!(ok && stderr.trim().is_empty(), "verify: {stderr}");

    // The same check on a unit with a misspelt key and a bad value must complain, or the
    // assertion above proves nothing.
    let broken = unit("gpumon.service")
        .replace(INSTALLED_BIN, BIN)
        .replace("ProtectSystem=strict", "ProtectSystm=strict")
        .replace("DevicePolicy=closed", "DevicePolicy=clsed");
    std::fs::write(&files[0], broken).unwrap();
    let (_, stderr) = verify(&files[..1]);
    assert!(stderr.contains("ProtectSystm"), "{stderr}");
    assert!(stderr.contains("clsed"), "{stderr}");
}

#[test]
fn the_sandbox_keeps_gpus_and_other_processes_visible() {
    let service = unit("gpumon.service");
    // Each of these would hide what the daemon reads: /dev/nvidia*, other users' /proc/PID.
    for (key, bad) in [
        ("PrivateDevices", &["yes", "true", "on", "1"][..]),
        ("ProtectProc", &["invisible", "noaccess", "ptraceable"][..]),
        ("ProcSubset", &["pid"][..]),
        ("PrivateUsers", &["yes", "true", "on", "1"][..]),
    ] {
        for v in setting(&service, key) {
            assert!(!bad.contains(&v), "{key}={v} hides what gpumon reads");
        }
    }
    // ProtectClock= implies a device allow-list: without the NVIDIA groups NVML cannot open
    // /dev/nvidiactl.
    let allowed = setting(&service, "DeviceAllow");
    for group in ["char-nvidia-frontend", "char-nvidiactl", "char-nvidia-uvm"] {
        assert!(
            allowed
                .iter()
                .any(|a| a.split_whitespace().next() == Some(group)),
            "DeviceAllow lacks {group}: {allowed:?}"
        );
    }
    assert_eq!(setting(&service, "User"), ["gpumon"]);
    assert_eq!(setting(&service, "NoNewPrivileges"), ["yes"]);
    assert_eq!(setting(&service, "ProtectSystem"), ["strict"]);
    assert_eq!(setting(&service, "Restart"), ["on-failure"]);

    let socket = unit("gpumon.socket");
    assert_eq!(
        setting(&socket, "ListenStream"),
        ["/run/gpumon/ingest.sock"],
        "the protocol's default path"
    );
    assert_eq!(setting(&socket, "SocketGroup"), ["gpumon"]);
    assert_eq!(setting(&socket, "SocketMode"), ["0660"]);
}

#[test]
fn systemd_rates_the_service_exposure_low() {
    if tools::find("systemd-analyze", "systemd").is_none() {
        return;
    }
    let dir = units_for_verify();
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(dir.path().join("gpumon.service"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let score: f64 = text
        .lines()
        .find_map(|l| l.split("gpumon.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {text}"));
    println!("systemd-analyze security: exposure {score} (0 = fully sandboxed, 10 = none)");
    // 1.8 when written; the sandbox only keeps open what NVML and /proc reading need.
    assert!(score <= 2.5, "exposure {score} rose; see:\n{text}");
}

#[test]
fn systemd_does_not_restart_a_config_error() {
    // The status the binary really exits with on a bad config, not a number copied here.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpumon.toml");
    std::fs::write(&config, "log_level = \"warning\"\n").unwrap();
    let out = Command::new(BIN)
        .args(exec_start_args(&config))
        .env_remove("GPUMON_LOG_LEVEL")
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    assert_ne!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let service = unit("gpumon.service");
    let prevented: Vec<&str> = setting(&service, "RestartPreventExitStatus")
        .iter()
        .flat_map(|v| v.split_whitespace())
        .collect();
    assert!(
        prevented.contains(&code.to_string().as_str()),
        "exit status {code} of a config error is not in RestartPreventExitStatus={prevented:?}"
    );
    // And a failure that a restart may cure (the HTTP port taken) is not in the list.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std::fs::write(&config, "").unwrap();
    let out = Command::new(BIN)
        .args(exec_start_args(&config))
        .args(["--listen", &busy.local_addr().unwrap().to_string()])
        .args(["--socket", dir.path().join("s.sock").to_str().unwrap()])
        .args(["--nvml-lib", "/nonexistent.so"])
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    assert!(
        code != 0 && !prevented.contains(&code.to_string().as_str()),
        "exit {code}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sysusers_and_tmpfiles_create_the_user_and_the_socket_directory() {
    if tools::find("systemd-sysusers", "systemd").is_none()
        || tools::find("systemd-tmpfiles", "systemd").is_none()
    {
        return;
    }
    // A scratch root laid out as a package installs the snippets.
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    std::fs::create_dir_all(r.join("etc")).unwrap();
    for (src, dst) in [
        ("sysusers.d/gpumon.conf", "usr/lib/sysusers.d/gpumon.conf"),
        ("tmpfiles.d/gpumon.conf", "usr/lib/tmpfiles.d/gpumon.conf"),
    ] {
        std::fs::create_dir_all(r.join(dst).parent().unwrap()).unwrap();
        std::fs::copy(Path::new(UNITS).join(src), r.join(dst)).unwrap();
    }
    let run = |tool: &str, args: &[&str]| {
        let out = Command::new(tool)
            .arg(format!("--root={}", r.display()))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{tool}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run("systemd-sysusers", &[]);
    let passwd = std::fs::read_to_string(r.join("etc/passwd")).unwrap();
    let user: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("gpumon:"))
        .unwrap_or_else(|| panic!("no gpumon user in {passwd}"))
        .split(':')
        .collect();
    assert_eq!(user[6], "/usr/sbin/nologin");
    let uid: u32 = user[2].parse().unwrap();
    assert!(uid < 1000, "a system user, got uid {uid}");
    let group = std::fs::read_to_string(r.join("etc/group")).unwrap();
    let gid: u32 = group
        .lines()
        .find_map(|l| l.strip_prefix("gpumon:x:"))
        .and_then(|rest| rest.split(':').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no gpumon group in {group}"));
    assert_eq!(
        user[3],
        gid.to_string(),
        "the user's primary group is gpumon"
    );

    run("systemd-tmpfiles", &["--create"]);
    let meta = std::fs::metadata(r.join("run/gpumon")).unwrap();
    assert!(meta.is_dir());
    assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    assert_eq!(meta.mode() & 0o7777, 0o755);
}

/// The service's ExecStart arguments after the binary, with the config path replaced.
fn exec_start_args(config: &Path) -> Vec<String> {
    let service = unit("gpumon.service");
    let line = setting(&service, "ExecStart")[0];
    let mut words = line.split_whitespace().map(str::to_string);
    assert_eq!(words.next().as_deref(), Some(INSTALLED_BIN));
    words
        .map(|w| {
            if w == "/etc/gpumon/gpumon.toml" {
                config.display().to_string()
            } else {
                w
            }
        })
        .collect()
}

#[test]
fn the_socket_activated_daemon_serves_a_pushing_trainer() {
    if tools::find("systemd-socket-activate", "systemd").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ingest.sock");
    let own_path = dir.path().join("not-used.sock");
    // The shipped example config, as an install copies it to /etc/gpumon/gpumon.toml.
    let config = dir.path().join("gpumon.toml");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/gpumon.example.toml"),
        &config,
    )
    .unwrap();
    let scenario = common::scenario("two_gpus");
    let env = [
        format!("FAKE_NVML_SCENARIO={}", scenario.display()),
        format!("GPUMON_NVML_LIB={}", common::fake_lib().display()),
        "GPUMON_LISTEN=127.0.0.1:0".into(),
        "GPUMON_INTERVAL=100ms".into(),
        "GPUMON_LOG_FORMAT=json".into(),
        // Were the inherited socket ignored, the daemon would bind here instead.
        format!("GPUMON_SOCKET={}", own_path.display()),
    ];
    let mut cmd = Command::new("systemd-socket-activate");
    cmd.arg("--listen").arg(&sock);
    for e in &env {
        cmd.arg("--setenv").arg(e);
    }
    let mut daemon = Activated(
        cmd.arg(BIN)
            .args(exec_start_args(&config))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let logs = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = logs.clone();
    let stderr = daemon.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    wait_until(&logs, "the socket to be listening", || sock.exists());

    // The first connection starts the daemon; the hello waits in the socket until it runs.
    let started = Instant::now();
    // The socket file appears at bind(), a moment before listen(): refused until then.
    let mut w = loop {
        match UnixStream::connect(&sock) {
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && started.elapsed() < Duration::from_secs(5) =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    w.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(w.try_clone().unwrap());
    w.write_all(
        format!(
            "{{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"llama-ft\",\"rank\":0,\"gpu_uuid\":\"{GPU0}\"}}\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let welcome: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("{e}: {line:?}; logs {:?}", logs.lock().unwrap()));
    assert_eq!(welcome["type"], "welcome", "{line}");
    println!(
        "socket activation: welcome {:?} after the first connect",
        started.elapsed()
    );
    for step in 1..=3u64 {
        w.write_all(
            format!(
                "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{},\"reserved_bytes.all.current\":{}}}}}\n",
                1_763_700_000 + step,
                step << 20,
                8u64 << 20
            )
            .as_bytes(),
        )
        .unwrap();
    }

    let addr = {
        let mut found = None;
        wait_until(&logs, "the daemon's listen address", || {
            found = logs.lock().unwrap().iter().find_map(|l| listen_addr(l));
            found.is_some()
        });
        found.unwrap()
    };
    let url = |p: &str| format!("http://{addr}{p}");
    let me = std::process::id();
    let labels =
        format!("{{gpu=\"0\",uuid=\"{GPU0}\",pid=\"{me}\",job_name=\"llama-ft\",rank=\"0\"}}");
    wait_until(&logs, "step 3 in /metrics", || {
        sample(
            &get(&url("/metrics")).1,
            &format!("gpumon_trainer_step{labels}"),
        ) == Some(3.0)
    });
    let m = get(&url("/metrics")).1;
    assert_eq!(
        sample(&m, &format!("gpumon_trainer_allocated_bytes{labels}")),
        Some((3u64 << 20) as f64)
    );
    assert_eq!(sample(&m, "gpumon_ingest_connections"), Some(1.0));
    assert_eq!(sample(&m, "gpumon_nvml_up"), Some(1.0));

    let snap: serde_json::Value = serde_json::from_str(&get(&url("/api/v1/snapshot")).1).unwrap();
    let s = &snap["sessions"][0];
    assert_eq!(s["session"], welcome["session"], "{snap}");
    assert_eq!(s["pid"].as_u64(), Some(me as u64));
    assert_eq!(s["samples"], 3);

    assert!(
        logs.lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("ingest socket inherited from systemd")),
        "{:?}",
        logs.lock().unwrap()
    );
    assert!(!own_path.exists(), "the daemon bound its own socket");

    // systemd restarts on failure only: a stop must be a clean exit.
    let status = daemon.stop();
    assert!(status.success(), "SIGTERM exit: {status}");
}

fn listen_addr(line: &str) -> Option<std::net::SocketAddr> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let f = v.get("fields")?;
    (f.get("message")?.as_str()? == "gpumon daemon serving")
        .then(|| f.get("listen")?.as_str()?.parse().ok())?
}

fn wait_until(logs: &Mutex<Vec<String>>, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "timed out waiting for {what}; logs: {:#?}",
        logs.lock().unwrap()
    );
}

/// systemd-socket-activate execs the daemon in its own process: this child is the daemon.
struct Activated(Child);

impl Activated {
    fn stop(&mut self) -> ExitStatus {
        // SAFETY: plain kill(2) on the child this test spawned and has not reaped.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "SIGTERM ignored");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Activated {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
