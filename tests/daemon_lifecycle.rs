//! The daemon under trouble: no library, failed init, a GPU lost mid-run, MIG, missing values,
//! process churn; plus `gpumon status` and config precedence on the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use common::*;

/// The exit status for a configuration error (sysexits.h), final for systemd.
const EX_CONFIG: i32 = 78;

#[test]
fn missing_library_keeps_serving_and_says_why() {
    let d = Daemon::start(DaemonOpts {
        nvml_lib: Some("/nonexistent/libnvidia-ml.so.1".into()),
        ..DaemonOpts::default()
    });
    let m = d.metrics();
    assert_eq!(sample(&m, "gpumon_nvml_up"), Some(0.0), "{m}");
    assert!(m.contains("gpumon_build_info{"));
    assert!(!m.contains("gpumon_gpu_memory"));
    promtool_check(&m);
    assert_eq!(d.get("/healthz").0, 200);
    let snap = d.snapshot();
    let err = snap["nvml"]["error"].as_str().unwrap();
    assert!(
        err.contains("/nonexistent/libnvidia-ml.so.1") && err.contains("--nvml-lib"),
        "{err}"
    );
    assert!(d.log_contains("NVML unavailable"));
    // Backoff: after ~1.5 s at a 100 ms interval, far fewer than 15 attempts were made.
    std::thread::sleep(Duration::from_millis(1500));
    let polls = sample(&d.metrics(), "gpumon_nvml_poll_errors_total").unwrap();
    assert!(
        (2.0..=6.0).contains(&polls),
        "backoff not applied: {polls} attempts"
    );
    assert!(d.stop().success());
}

#[test]
fn init_failure_is_reported_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.toml");
    std::fs::write(
        &path,
        "init_error = \"no_permission\"\n[[gpu]]\nmemory_total = 1000\n",
    )
    .unwrap();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&path),
        ..DaemonOpts::default()
    });
    assert_eq!(sample(&d.metrics(), "gpumon_nvml_up"), Some(0.0));
    let err = d.snapshot()["nvml"]["error"].as_str().unwrap().to_string();
    assert!(
        err.contains("init failed") && err.contains("permission"),
        "{err}"
    );
    assert!(d.stop().success());
}

#[test]
fn lost_gpu_is_reported_and_the_others_go_on() {
    let d = Daemon::with_scenario("gpu_lost");
    d.wait_for(Duration::from_secs(10), "GPU 1 lost", || {
        d.metrics()
            .lines()
            .any(|l| l.starts_with("gpumon_gpu_up{gpu=\"1\"") && l.ends_with(" 0"))
    });
    let m = d.metrics();
    assert_eq!(sample(&m, "gpumon_nvml_up"), Some(1.0));
    assert!(m
        .lines()
        .any(|l| l.starts_with("gpumon_gpu_up{gpu=\"0\"") && l.ends_with(" 1")));
    assert!(m.contains("gpumon_gpu_memory_used_bytes{gpu=\"0\""));
    assert!(!m.contains("gpumon_gpu_memory_used_bytes{gpu=\"1\""));
    let snap = d.snapshot();
    assert_eq!(snap["gpus"][1]["state"], "lost");
    assert!(snap["gpus"][1]["error"]
        .as_str()
        .unwrap()
        .contains("fallen off the bus"));
    // The lost GPU keeps the identity it had before it was lost.
    assert!(snap["gpus"][1]["uuid"]
        .as_str()
        .unwrap()
        .starts_with("GPU-"));
    assert!(d.log_contains("GPU cannot be read"));
    promtool_check(&m);
    assert!(d.stop().success());
}

#[test]
fn mig_devices_and_their_processes() {
    let d = Daemon::with_scenario("mig");
    let m = d.metrics();
    assert!(
        count_series(&m, "gpumon_mig_memory_total_bytes") >= 3,
        "{m}"
    );
    let snap = d.snapshot();
    let mig_gpu = snap["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["mig_mode"] == true)
        .unwrap();
    let migs = mig_gpu["mig_devices"].as_array().unwrap();
    assert!(migs.len() >= 3);
    assert!(migs
        .iter()
        .all(|m| m["uuid"].as_str().unwrap().starts_with("MIG-")));
    let on_mig: Vec<_> = snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["mig_uuid"].is_string())
        .collect();
    assert!(!on_mig.is_empty(), "{snap}");
    for p in on_mig {
        assert!(p["gpu_instance_id"].is_u64(), "{p}");
        assert!(migs.iter().any(|m| m["uuid"] == p["mig_uuid"]));
    }
    promtool_check(&m);
}

#[test]
fn not_available_stays_absent() {
    let d = Daemon::with_scenario("not_available");
    let m = d.metrics();
    let snap = d.snapshot();
    let na: Vec<_> = snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["used_memory_bytes"].is_null())
        .collect();
    assert!(!na.is_empty(), "scenario has n/a processes: {snap}");
    for p in na {
        let pid = p["pid"].as_u64().unwrap();
        let has = |name: &str| {
            m.lines()
                .any(|l| l.starts_with(name) && l.contains(&format!("pid=\"{pid}\"")))
        };
        assert!(
            !has("gpumon_process_memory_used_bytes{"),
            "n/a must be absent, not 0"
        );
        assert!(has("gpumon_process_info{"));
    }
    assert!(!m.contains("gpumon_gpu_temperature_celsius{"), "{m}");
    let status = Command::new(BIN)
        .args(["--config", empty_config().path().to_str().unwrap()])
        .args(["status", "--listen", &d.addr.to_string()])
        .output()
        .unwrap();
    let table = String::from_utf8(status.stdout).unwrap();
    assert!(table.contains("n/a"), "{table}");
    assert!(
        table.contains(&format!("daemon http://{}", d.addr)),
        "{table}"
    );
}

#[test]
fn process_churn_leaves_no_stale_series() {
    let d = Daemon::with_scenario("churn");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let snap = d.snapshot();
        let live: Vec<u64> = snap["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_u64().unwrap())
            .collect();
        seen.extend(live.iter().copied());
        let m = d.metrics();
        let series = count_series(&m, "gpumon_process_memory_used_bytes");
        // Never more series than a churn window holds, however many pids have come and gone.
        assert!(series <= 64, "{series} process series");
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(
        seen.len() > 64,
        "churn scenario should cycle many pids, saw {}",
        seen.len()
    );
}

#[test]
fn status_reads_nvml_directly_when_no_daemon_runs() {
    let out = Command::new(BIN)
        .args(["--config", empty_config().path().to_str().unwrap()])
        .args(["status", "--listen", "127.0.0.1:1", "--nvml-lib"])
        .arg(fake_lib())
        .env("FAKE_NVML_SCENARIO", scenario("two_gpus"))
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains("NVML directly (no daemon answered at http://127.0.0.1:1"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .filter(|l| l.starts_with("0 ") || l.starts_with("1 "))
            .count()
            >= 2,
        "{table}"
    );

    let json = Command::new(BIN)
        .args(["--config", empty_config().path().to_str().unwrap()])
        .args(["status", "--json", "--direct", "--nvml-lib"])
        .arg(fake_lib())
        .env("FAKE_NVML_SCENARIO", scenario("two_gpus"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["gpus"].as_array().unwrap().len(), 2);

    let failed = Command::new(BIN)
        .args(["--config", empty_config().path().to_str().unwrap()])
        .args(["status", "--direct", "--nvml-lib", "/nonexistent.so"])
        .output()
        .unwrap();
    assert!(!failed.status.success());
    assert!(String::from_utf8_lossy(&failed.stderr).contains("/nonexistent.so"));

    // Neither a daemon nor NVML: both named, and the way on for a machine without a GPU.
    let neither = Command::new(BIN)
        .args(["--config", empty_config().path().to_str().unwrap()])
        .args([
            "status",
            "--listen",
            "127.0.0.1:1",
            "--nvml-lib",
            "/nonexistent.so",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&neither.stderr);
    assert!(!neither.status.success());
    assert!(
        err.contains("no daemon answered at http://127.0.0.1:1")
            && err.contains("/nonexistent.so")
            && err.contains("gpumon demo"),
        "{err}"
    );
}

#[test]
fn config_precedence_is_file_then_env_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpumon.toml");
    std::fs::write(&file, "interval = \"5s\"\nnvml_lib = \"/from/file.so\"\n").unwrap();
    let run = |env: &[(&str, &str)], flags: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["--config", file.to_str().unwrap(), "--log-format", "json"])
            .args(["daemon", "--listen", "127.0.0.1:0", "--socket"])
            .arg(dir.path().join("ingest.sock"))
            .args(flags)
            .env_remove("GPUMON_INTERVAL")
            .env_remove("GPUMON_NVML_LIB")
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
        let line = lines
            .find(|l| l.as_ref().unwrap().contains("gpumon daemon serving"))
            .unwrap()
            .unwrap();
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        assert!(child.wait().unwrap().success());
        line
    };
    let l = run(&[], &[]);
    assert!(l.contains("5s") && l.contains("/from/file.so"), "{l}");
    let l = run(&[("GPUMON_INTERVAL", "2s")], &[]);
    assert!(l.contains("2s") && l.contains("/from/file.so"), "{l}");
    let l = run(
        &[("GPUMON_INTERVAL", "2s")],
        &["--interval", "300ms", "--nvml-lib", "/from/flag.so"],
    );
    assert!(l.contains("300ms") && l.contains("/from/flag.so"), "{l}");

    std::fs::write(&file, "intervall = \"5s\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["--config", file.to_str().unwrap(), "daemon"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(EX_CONFIG));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("intervall") && err.contains("gpumon.toml"),
        "{err}"
    );
}

/// `gpumon status | head`, `gpumon config | head -1`: a reader that has gone is no failure, and
/// no panic (Rust ignores SIGPIPE, so a plain `print!` panics on the broken pipe).
#[test]
fn a_reader_that_closed_early_is_no_error() {
    let config = empty_config();
    let runs: [(&str, Vec<&str>); 3] = [
        ("status", vec!["status", "--direct", "--nvml-lib"]),
        (
            "status --json",
            vec!["status", "--json", "--direct", "--nvml-lib"],
        ),
        ("config", vec!["config"]),
    ];
    for (what, args) in runs {
        // The read end is closed before the child starts: its first write fails with EPIPE.
        let (read, write) = rustix::pipe::pipe().unwrap();
        drop(read);
        let mut cmd = Command::new(BIN);
        cmd.args(["--config", config.path().to_str().unwrap()])
            .args(&args)
            .env("FAKE_NVML_SCENARIO", scenario("two_gpus"))
            .stdout(std::process::Stdio::from(write));
        if args.contains(&"--nvml-lib") {
            cmd.arg(fake_lib());
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {:?}\n{err}", out.status);
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}

#[test]
fn config_command_prints_the_shipped_example() {
    let out = Command::new(BIN).arg("config").output().unwrap();
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gpumon.example.toml"))
            .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), shipped);
}

/// `gpumon daemon` with `args` and `env` that must fail at start: (exit code, stderr).
fn failed_start(config: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let file = empty_config();
    std::fs::write(file.path(), config).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["--config", file.path().to_str().unwrap()])
        .args([
            "daemon",
            "--listen",
            "127.0.0.1:0",
            "--nvml-lib",
            "/nonexistent.so",
        ])
        .args(args)
        .env_remove("GPUMON_LOG_LEVEL")
        .env_remove("GPUMON_SOCKET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("the daemon started with {config:?} {args:?} {env:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_log_level_that_would_silence_the_daemon_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ingest.sock");
    let sock = sock.to_str().unwrap();
    for bad in ["warning", "verbose", ""] {
        let (code, err) = failed_start(&format!("log_level = {bad:?}\n"), &["--socket", sock], &[]);
        assert_eq!(code, Some(EX_CONFIG), "{bad:?}: {err}");
        assert!(
            err.contains("log_level") && err.contains(&format!("{bad:?}")),
            "{bad:?}: {err}"
        );
        let (code, err) = failed_start("", &["--socket", sock], &[("GPUMON_LOG_LEVEL", bad)]);
        assert_eq!(code, Some(EX_CONFIG), "GPUMON_LOG_LEVEL={bad:?}: {err}");
        assert!(err.contains(&format!("{bad:?}")), "{err}");
    }
    assert!(!dir.path().join("ingest.sock").exists());
    // Real filter syntax still starts, and logs at the levels it names.
    let d = Daemon::start(DaemonOpts {
        env: vec![("GPUMON_LOG_LEVEL".into(), "warn,gpumon::daemon=info".into())],
        ..DaemonOpts::default()
    });
    assert!(d.log_contains("gpumon daemon serving"));
    assert!(
        !d.log_contains("ingest socket ready"),
        "an info line of another target"
    );
    assert!(d.stop().success());
}

#[test]
fn variables_for_file_only_keys_and_a_missing_procfs_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ingest.sock");
    let sock = sock.to_str().unwrap();
    let (code, err) = failed_start(
        "",
        &["--socket", sock],
        &[("GPUMON_INGEST_MAX_CONNECTIONS", "4")],
    );
    assert_eq!(code, Some(EX_CONFIG), "{err}");
    assert!(
        err.contains("GPUMON_INGEST_MAX_CONNECTIONS") && err.contains("ingest.max_connections"),
        "{err}"
    );
    // A misspelt variable, which nothing reads: named, with the one that was meant.
    let (code, err) = failed_start(
        "",
        &["--socket", sock],
        &[("GPUMON_LISTENN", "127.0.0.1:9")],
    );
    assert_eq!(code, Some(EX_CONFIG), "{err}");
    assert!(
        err.contains("GPUMON_LISTENN") && err.contains("did you mean GPUMON_LISTEN?"),
        "{err}"
    );
    let missing = dir.path().join("no-proc");
    let (code, err) = failed_start(
        "",
        &["--socket", sock, "--procfs", missing.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(EX_CONFIG), "{err}");
    assert!(
        err.contains("procfs") && err.contains(missing.to_str().unwrap()),
        "{err}"
    );
    assert!(!dir.path().join("ingest.sock").exists());
}

#[test]
fn the_socket_file_goes_on_a_clean_exit_and_a_stale_one_is_replaced() {
    let d = Daemon::start(DaemonOpts::default());
    let sock = d.socket.clone();
    assert!(sock.exists());
    assert!(d.stop().success());
    assert!(!sock.exists(), "{} left after SIGTERM", sock.display());

    // A socket left by a run that was killed is taken over (nothing listens on it).
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("ingest.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let mut child = Command::new(BIN)
        .args(["--config", "/dev/null"])
        .args([
            "daemon",
            "--listen",
            "127.0.0.1:0",
            "--nvml-lib",
            "/nonexistent.so",
            "--socket",
        ])
        .arg(&stale)
        .env("GPUMON_LOG_LEVEL", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
    let seen: Vec<String> = lines
        .by_ref()
        .map_while(Result::ok)
        .take_while(|l| !l.contains("ingest socket ready"))
        .collect();
    assert!(
        std::os::unix::net::UnixStream::connect(&stale).is_ok(),
        "{seen:?}"
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    assert!(!stale.exists());
}

#[test]
fn a_socket_path_that_cannot_be_used_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // A file that is not a socket is never deleted.
    let file = dir.path().join("ingest.sock");
    std::fs::write(&file, "keep me").unwrap();
    let (code, err) = failed_start("", &["--socket", file.to_str().unwrap()], &[]);
    assert_eq!(code, Some(EX_CONFIG), "{err}");
    assert!(
        err.contains(file.to_str().unwrap()) && err.contains("not a socket"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");

    // A configured path in a directory that does not exist: refused, not created.
    let typo = dir.path().join("gpmuon/ingest.sock");
    let (code, err) = failed_start("", &["--socket", typo.to_str().unwrap()], &[]);
    assert_eq!(code, Some(EX_CONFIG), "{err}");
    assert!(
        err.contains(typo.to_str().unwrap()) && err.contains("does not exist"),
        "{err}"
    );
    assert!(!typo.parent().unwrap().exists());

    // A stale socket the daemon's user cannot remove (a root-owned one in a directory it cannot
    // write, as after a run as root): the error names it. As root, the daemon runs as nobody;
    // otherwise the directory is made read-only.
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    let stale = locked.join("ingest.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let root = unsafe { libc::geteuid() } == 0;
    let mode = |m| std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(m)).unwrap();
    mode(if root { 0o755 } else { 0o555 });
    // A root tempdir is 0700: nobody must be able to reach the socket's directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Nor may nobody be able to reach the binary where it was built (a clone in /root is 0700):
    // it runs from a copy in that directory.
    let bin = if root {
        let copy = dir.path().join("gpumon");
        std::fs::copy(BIN, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        copy
    } else {
        BIN.into()
    };
    if root {
        if let Some(closed) = closed_to_others(dir.path()) {
            // TMPDIR itself is out of nobody's reach: no directory here would do.
            eprintln!(
                "skipped: the stale-socket check as nobody needs a directory nobody can reach; {} is not (mode o-x); set TMPDIR to one that is",
                closed.display()
            );
            mode(0o755);
            return;
        }
    }
    let mut cmd = Command::new(&bin);
    cmd.args(["--config", "/dev/null", "daemon", "--listen", "127.0.0.1:0"])
        .args(["--nvml-lib", "/nonexistent.so", "--socket"])
        .arg(&stale)
        .env_remove("GPUMON_LOG_LEVEL");
    if root {
        cmd.uid(65534).gid(65534);
    }
    let out = common::retry_busy(|| cmd.output()).unwrap();
    mode(0o755);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(stale.to_str().unwrap()) && err.contains("stale socket"),
        "{err}"
    );
    assert!(stale.exists());
}

/// The first directory above `path` (or itself) that others may not enter, if any.
fn closed_to_others(path: &std::path::Path) -> Option<std::path::PathBuf> {
    path.ancestors()
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.permissions().mode() & 0o001 == 0)
                .unwrap_or(true)
        })
        .map(std::path::Path::to_path_buf)
}

#[test]
fn ingest_timeouts_from_the_config_reach_the_server() {
    let d = Daemon::start(DaemonOpts {
        config: "[ingest]\nhello_timeout_seconds = 0.3\n".into(),
        ..DaemonOpts::default()
    });
    let mut silent = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let start = std::time::Instant::now();
    let mut rest = String::new();
    // Closed by the daemon (after at most an error line): read_to_string returns at EOF.
    std::io::Read::read_to_string(&mut silent, &mut rest).unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "closed after {waited:?} (hello_timeout_seconds = 0.3; default 10 s): {rest:?}"
    );
    assert!(d.stop().success());
}

/// `gpumon daemon 2>&1 | tee log`, then Ctrl-C, which ends tee too: the daemon's stderr is a
/// pipe with no reader. Every later log line fails with EPIPE; before, the line logged on
/// SIGTERM panicked the task that starts shutdown and only SIGKILL ended the daemon.
#[test]
fn a_daemon_whose_log_reader_is_gone_still_serves_and_stops_on_sigterm() {
    for format in ["text", "json"] {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ingest.sock");
        let mut child = Command::new(BIN)
            .args(["--config", "/dev/null", "--log-format", format])
            .args(["daemon", "--listen", "127.0.0.1:0", "--interval", "100ms"])
            .arg("--nvml-lib")
            .arg(fake_lib())
            .arg("--socket")
            .arg(&sock)
            .env("FAKE_NVML_SCENARIO", scenario("two_gpus"))
            .env("GPUMON_LOG_LEVEL", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
        let addr: std::net::SocketAddr = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| {
                let at = l.find("listen")? + "listen".len();
                let rest = l[at..].trim_start_matches(['=', '"', ':']);
                rest.split(['"', ' ', ',']).next()?.parse().ok()
            })
            .expect("no listen address logged");
        // The reader goes, as tee does on Ctrl-C.
        drop(lines);
        // Lines the daemon now logs hit the closed pipe: a trainer's session opens and closes.
        for _ in 0..50 {
            let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
            std::io::Write::write_all(
                &mut s,
                b"{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"j\"}\n{\"type\":\"bye\"}\n",
            )
            .unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut reply = String::new();
            let _ = std::io::Read::read_to_string(&mut s, &mut reply);
        }
        let url = |p: &str| format!("http://{addr}{p}");
        assert_eq!(get(&url("/healthz")).0, 200, "{format}: stopped serving");
        let lost = (0..100)
            .find_map(|_| {
                let n = sample(&get(&url("/metrics")).1, "gpumon_log_lost_total")?;
                if n > 0.0 {
                    return Some(n);
                }
                std::thread::sleep(Duration::from_millis(50));
                None
            })
            .unwrap_or_else(|| panic!("{format}: no lost log line counted"));
        let start = std::time::Instant::now();
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        // A deadline, not a benchmark: the bug was "never"; a clean stop takes milliseconds.
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("{format}: SIGTERM ignored with the log pipe closed");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        eprintln!(
            "{format}: {lost} log lines lost; stopped {:?} after SIGTERM",
            start.elapsed()
        );
        assert!(status.success(), "{format}: {status:?}");
        assert!(!sock.exists(), "{format}: {} left behind", sock.display());
    }
}
