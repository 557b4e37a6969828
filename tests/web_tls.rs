//! `--web.config.file` (exporter-toolkit's format) against the real daemon: certificates made
//! by openssl here, requests made by curl, and a real Prometheus scraping over TLS with basic
//! auth. Every refusal (wrong password, no client certificate, plain HTTP to the TLS port) is
//! counted, and the daemon keeps serving the clients that do it right.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod stack;
mod tools;
mod web;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{fake_lib, BIN};
use web::{certificates, sample, tls_daemon, until_code, web_yml, Daemon};

#[test]
fn tls_and_basic_auth_refuse_cleanly_count_and_keep_serving() {
    let (dir, web, daemon) = tls_daemon("alice", "correct horse");
    let d = dir.path();
    let alice = ["--cacert", "ca.pem", "-u", "alice:correct horse"];
    until_code(&daemon, &alice, 200, "no TLS answer");
    let body = daemon.metrics("alice", "correct horse");
    assert!(body.contains("gpumon_nvml_up 1"), "{body}");
    let headers = std::fs::read_to_string(d.join("headers.txt"))
        .unwrap()
        .to_lowercase();
    assert!(
        headers.contains("x-content-type-options: nosniff"),
        "{headers}"
    );

    // Wrong password and none: 401 with the scheme named.
    let (code, _, _) = daemon.curl(
        "https",
        "/metrics",
        &["--cacert", "ca.pem", "-u", "alice:wrong"],
    );
    assert_eq!(code, 401);
    let (code, _, _) = daemon.curl("https", "/metrics", &["--cacert", "ca.pem"]);
    assert_eq!(code, 401);
    let headers = std::fs::read_to_string(d.join("headers.txt"))
        .unwrap()
        .to_lowercase();
    assert!(headers.contains("www-authenticate: basic"), "{headers}");
    // Plain HTTP to the TLS port: no HTTP answer at all, and the daemon goes on.
    let (code, _, exit) = daemon.curl("http", "/metrics", &["-u", "alice:correct horse"]);
    assert!(code == 0 || code == 400, "plain HTTP got {code}");
    assert_ne!(exit, 0);
    // A client that does not trust the certificate gives up (the server is fine).
    let (code, _, exit) = daemon.curl("https", "/metrics", &[]);
    assert_eq!((code, exit != 0), (0, true));

    let m = daemon.metrics("alice", "correct horse");
    assert!(
        sample(
            &m,
            "gpumon_http_requests_denied_total{reason=\"unauthorized\"}"
        ) >= 2.0,
        "{m}"
    );
    assert!(
        sample(
            &m,
            "gpumon_http_connections_closed_total{reason=\"tls_handshake\"}"
        ) >= 2.0,
        "{m}"
    );

    // `gpumon status` speaks TLS and basic auth: credentials from a file or the environment.
    std::fs::write(d.join("creds"), "alice:correct horse\n").unwrap();
    let url = format!("https://127.0.0.1:{}", daemon.port);
    let status = |extra: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(d)
            .args([
                "--config",
                "gpumon.toml",
                "status",
                "--connect",
                &url,
                "--ca-file",
                "ca.pem",
            ])
            .args(extra)
            .env_remove("GPUMON_BASIC_AUTH");
        if let Some(v) = env {
            cmd.env("GPUMON_BASIC_AUTH", v);
        }
        cmd.output().unwrap()
    };
    let out = status(&["--credentials-file", "creds"], None);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains(&url) && table.contains("NVIDIA H100"),
        "{table}"
    );
    assert!(status(&[], Some("alice:correct horse")).status.success());
    let out = status(&[], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("401"), "{err}");
    let out = status(&[], Some("alice:wrong"));
    assert!(!out.status.success());

    // Rotated: the file changes and the new user is in, without a restart.
    web_yml(d, "", "bob", "battery staple");
    let bob = ["--cacert", "ca.pem", "-u", "bob:battery staple"];
    until_code(&daemon, &bob, 200, "the new file was not taken");
    assert_eq!(daemon.curl("https", "/healthz", &alice).0, 401);
    // A broken file, with SIGHUP: the config in force stays.
    std::fs::write(&web, "basic_auth_users: [broken\n").unwrap();
    unsafe {
        libc::kill(daemon.child.id() as i32, libc::SIGHUP);
    }
    std::thread::sleep(Duration::from_millis(1500));
    daemon.metrics("bob", "battery staple");
}

#[test]
fn a_client_certificate_is_required_when_the_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("gpumon.toml"), "").unwrap();
    certificates(d);
    let web = web_yml(
        d,
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n",
        "alice",
        "pw",
    );
    let daemon = Daemon::start(d, &web);
    let with_cert = [
        "--cacert",
        "ca.pem",
        "--cert",
        "client.pem",
        "--key",
        "client.key",
        "-u",
        "alice:pw",
    ];
    let start = Instant::now();
    while daemon.curl("https", "/healthz", &with_cert).0 != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no TLS answer with a client certificate"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, _, exit) = daemon.curl(
        "https",
        "/healthz",
        &["--cacert", "ca.pem", "-u", "alice:pw"],
    );
    assert_eq!(
        (code, exit != 0),
        (0, true),
        "no client certificate: refused in the handshake"
    );
    // A certificate from another CA is refused the same way.
    std::fs::create_dir(d.join("other")).unwrap();
    certificates(&d.join("other"));
    let (code, _, _) = daemon.curl(
        "https",
        "/healthz",
        &[
            "--cacert",
            "ca.pem",
            "--cert",
            "other/client.pem",
            "--key",
            "other/client.key",
            "-u",
            "alice:pw",
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(daemon.curl("https", "/healthz", &with_cert).0, 200);
}

#[test]
fn a_bad_web_config_stops_the_start_with_the_key_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let web = d.join("web.yml");
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n",
    )
    .unwrap();
    std::fs::write(d.join("gpumon.toml"), "").unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(d.join("gpumon.toml"))
        .args(["daemon", "--listen", "127.0.0.1:0", "--nvml-lib"])
        .arg(fake_lib())
        .arg("--socket")
        .arg(d.join("ingest.sock"))
        .arg("--web.config.file")
        .arg(&web)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("tls_server_config.cert_file") && err.contains("missing.pem"),
        "{err}"
    );
}

#[test]
fn prometheus_scrapes_over_tls_with_basic_auth() {
    let Some(prometheus) = tools::find("prometheus", "prometheus") else {
        return;
    };
    let (dir, _, daemon) = tls_daemon("prometheus", "scrape-secret");
    let d = dir.path();
    std::fs::write(d.join("password"), "scrape-secret").unwrap();
    let cfg = d.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpumon\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n    basic_auth:\n      username: prometheus\n      password_file: {pw}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n",
            ca = d.join("ca.pem").display(),
            pw = d.join("password").display(),
            port = daemon.port
        ),
    )
    .unwrap();
    let port = stack::free_port();
    let mut cmd = Command::new(prometheus);
    cmd.arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", d.join("prom").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"));
    let (proc, _) = stack::Proc::spawn("prometheus", cmd);
    let url = format!("http://127.0.0.1:{port}");
    stack::wait_ready(
        &format!("{url}/-/ready"),
        "prometheus",
        &proc,
        Duration::from_secs(30),
    );
    let start = Instant::now();
    loop {
        let up = stack::query(&url, "up{job=\"gpumon\"}").unwrap_or_default();
        let nvml = stack::query(&url, "gpumon_nvml_up").unwrap_or_default();
        if up.first().map(|s| s["value"][1] == "1").unwrap_or(false) && !nvml.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "Prometheus did not scrape over TLS: {up:?}; {}",
            proc.tail()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let m = daemon.metrics("prometheus", "scrape-secret");
    assert_eq!(
        sample(
            &m,
            "gpumon_http_requests_denied_total{reason=\"unauthorized\"}"
        ),
        0.0
    );
}

#[test]
fn a_rotated_certificate_applies_without_a_signal_and_sighup_rereads_the_file() {
    let (dir, web, daemon) = tls_daemon("alice", "correct horse");
    let d = dir.path();
    let (old_ca, new_ca) = (
        ["--cacert", "ca.pem", "-u", "alice:correct horse"],
        ["--cacert", "new/ca.pem", "-u", "alice:correct horse"],
    );
    until_code(&daemon, &old_ca, 200, "the first certificate is served");

    // cert-manager style: a new certificate from another CA renamed over the old files, one
    // file at a time (a mismatched pair in between fails to load and the old pair stays).
    std::fs::create_dir(d.join("new")).unwrap();
    certificates(&d.join("new"));
    for f in ["server.pem", "server.key"] {
        std::fs::copy(d.join("new").join(f), d.join(format!("{f}.tmp"))).unwrap();
        std::fs::rename(d.join(format!("{f}.tmp")), d.join(f)).unwrap();
    }
    until_code(
        &daemon,
        &new_ca,
        200,
        "the rotated certificate was not taken",
    );
    assert_eq!(daemon.curl("https", "/healthz", &old_ca).0, 0);

    // The same file with another user, its size and time unchanged: only SIGHUP reads it.
    let stamp = std::fs::metadata(&web).unwrap().modified().unwrap();
    let before = std::fs::read(&web).unwrap().len();
    web_yml(d, "", "carol", "correct horse");
    assert_eq!(std::fs::read(&web).unwrap().len(), before);
    std::fs::File::options()
        .write(true)
        .open(&web)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    let carol = ["--cacert", "new/ca.pem", "-u", "carol:correct horse"];
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(daemon.curl("https", "/healthz", &carol).0, 401);
    assert_eq!(daemon.curl("https", "/healthz", &new_ca).0, 200);
    unsafe {
        libc::kill(daemon.child.id() as i32, libc::SIGHUP);
    }
    until_code(&daemon, &carol, 200, "SIGHUP did not reload the file");
    assert_eq!(daemon.curl("https", "/healthz", &new_ca).0, 401);
}
