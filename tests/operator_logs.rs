//! What the daemon's log tells an operator: one line saying what it serves (TLS, auth, record
//! directory), a line per trainer session opened and closed, a bad web config as the first and
//! only line; and one-shot commands that keep the daemon's lines to themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, DaemonOpts, BIN};

fn wait_log(d: &Daemon, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        if let Some(l) = d.logs.lock().unwrap().iter().find(|l| cond(l)) {
            return l.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no {what} in {:#?}",
            d.logs.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_log_says_what_is_served_and_each_session_that_opened_and_closed() {
    let d = Daemon::start(DaemonOpts::default());
    let serving = wait_log(&d, "serving line", |l| l.contains("gpumon daemon serving"));
    let v: serde_json::Value = serde_json::from_str(&serving).unwrap();
    let f = &v["fields"];
    assert_eq!(
        (&f["tls"], &f["client_certs"], &f["basic_auth_users"]),
        (
            &serde_json::json!(false),
            &serde_json::json!(false),
            &serde_json::json!(0)
        ),
        "{serving}"
    );
    assert_eq!(f["record_dir"], "off", "{serving}");

    for bye in [true, false] {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        writeln!(
            s,
            r#"{{"type":"hello","v":1,"job":"logged-{bye}","rank":0,"gpu_uuid":"GPU-x"}}"#
        )
        .unwrap();
        let mut welcome = String::new();
        BufReader::new(s.try_clone().unwrap())
            .read_line(&mut welcome)
            .unwrap();
        if bye {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            writeln!(s, r#"{{"type":"bye","ts":{now}}}"#).unwrap();
        }
        drop(s);
        let job = format!("logged-{bye}");
        let opened = wait_log(&d, "opened line", |l| {
            l.contains("trainer session opened") && l.contains(&job)
        });
        assert!(
            opened.contains(&format!("\"uid\":{}", unsafe { libc::getuid() })),
            "{opened}"
        );
        let closed = wait_log(&d, "closed line", |l| {
            l.contains("trainer session closed") && l.contains(&job)
        });
        let how = if bye { "bye" } else { "crash (no bye)" };
        assert!(closed.contains(&format!("\"ended\":\"{how}\"")), "{closed}");
    }
}

#[test]
fn a_bad_web_config_is_the_first_and_only_line() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(&web, "tls_server_config:\n  cert_file: missing.pem\n").unwrap();
    let out = Command::new(BIN)
        .args(["--config", "/dev/null", "daemon", "--listen", "127.0.0.1:0"])
        .arg("--socket")
        .arg(dir.path().join("ingest.sock"))
        .arg("--web.config.file")
        .arg(&web)
        .env("GPUMON_LOG_LEVEL", "info")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("web_config_file") || err.contains("web.config"),
        "{err}"
    );
    assert!(!err.contains("ingest socket ready"), "{err}");
    assert!(!dir.path().join("ingest.sock").exists());
}

#[test]
fn status_without_a_daemon_or_nvml_prints_only_its_own_words() {
    let out = Command::new(BIN)
        .args(["--config", "/dev/null", "status", "--listen", "127.0.0.1:1"])
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .env("GPUMON_LOG_LEVEL", "info")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("serving gpumon_nvml_up 0"), "{err}");
    assert!(!err.contains("gpumon daemon serving"), "{err}");
}

#[test]
fn a_relative_record_dir_is_taken_from_the_current_directory() {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .current_dir(cwd.path())
        .args(["--config", "/dev/null", "--log-format", "json", "daemon"])
        .args(["--listen", "127.0.0.1:0", "--nvml-lib", "/nonexistent.so"])
        .args(["--socket", "ingest.sock", "--record-dir", "traces"])
        .env("GPUMON_LOG_LEVEL", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let serving = lines
        .map_while(Result::ok)
        .find(|l| l.contains("gpumon daemon serving"));
    let _ = child.kill();
    let _ = child.wait();
    let serving = serving.expect("the daemon started with a relative --record-dir");
    let v: serde_json::Value = serde_json::from_str(&serving).unwrap();
    let want = cwd.path().canonicalize().unwrap().join("traces");
    let got = std::path::PathBuf::from(v["fields"]["record_dir"].as_str().unwrap());
    assert_eq!(got.canonicalize().unwrap(), want, "{serving}");
}
