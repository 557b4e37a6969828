//! A web config reload fails closed, against the real daemon over real TLS on loopback: a file
//! rewritten in place (`cat new > web.yml`: truncated, then written) with a plain config, then
//! emptied, given a key that is not the certificate's, deleted, and SIGHUP: the port keeps
//! answering only TLS with basic auth, and each refusal is logged and counted. A new
//! certificate and password written the same way apply, and never half-read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod stack;
mod web;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use web::{certificates, sample, tls_daemon, until_code, Daemon};

const ALICE: [&str; 4] = ["--cacert", "ca.pem", "-u", "alice:correct horse"];
const REFUSED: &str = "web config reload refused";

/// (gpumon_web_config_last_reload_successful, _reload_failures_total, _success_timestamp).
fn reloads(d: &Daemon, ca: &str, user: &str) -> (f64, f64, f64) {
    let (code, m, _) = d.curl("https", "/metrics", &["--cacert", ca, "-u", user]);
    assert_eq!(code, 200, "{m}");
    (
        sample(&m, "gpumon_web_config_last_reload_successful"),
        sample(&m, "gpumon_web_config_reload_failures_total"),
        sample(
            &m,
            "gpumon_web_config_last_reload_success_timestamp_seconds",
        ),
    )
}

/// Writes `text` over `path` as `cat new > path` does, the second half `pause` after the first.
fn write_in_place(path: &Path, text: &str, pause: Duration) {
    let mut f = std::fs::File::create(path).unwrap();
    let mid = text.len() / 2;
    f.write_all(&text.as_bytes()[..mid]).unwrap();
    std::thread::sleep(pause);
    f.write_all(&text.as_bytes()[mid..]).unwrap();
}

/// A web config with TLS from `cert` and `key` and these (user, password)s.
fn config(cert: &str, key: &str, users: &[(&str, &str)]) -> String {
    let mut s =
        format!("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\nbasic_auth_users:\n");
    for (user, password) in users {
        let hash = bcrypt::hash(password, 4).unwrap();
        s.push_str(&format!("  {user}: \"{hash}\"\n"));
    }
    s
}

/// Log lines holding every one of `parts`.
fn log_lines(d: &Daemon, parts: &[&str]) -> usize {
    d.log_text()
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .count()
}

/// Waits up to 10 s for one more refusal whose reason holds `why`.
fn until_refused(d: &Daemon, why: &str) {
    let before = log_lines(d, &[REFUSED, why]);
    let start = Instant::now();
    while log_lines(d, &[REFUSED, why]) == before {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no refusal saying {why:?}:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The port still answers only TLS, and only with the password.
fn still_closed(d: &Daemon, step: &str) {
    for path in ["/api/v1/snapshot", "/metrics"] {
        let (code, _, exit) = d.curl("http", path, &[]);
        assert!(
            code != 200 && exit != 0,
            "{step}: plain HTTP got {code} from {path}"
        );
        let (code, _, _) = d.curl("https", path, &["--cacert", "ca.pem"]);
        assert_eq!(code, 401, "{step}: no password got {code} from {path}");
        let (code, _, _) = d.curl("https", path, &ALICE);
        assert_eq!(code, 200, "{step}: the password in force got {code}");
    }
    let (ok, _, _) = reloads(d, "ca.pem", "alice:correct horse");
    assert_eq!(ok, 0.0, "{step}: the last reload failed");
}

#[test]
fn reloads_that_would_open_the_port_are_refused_and_tls_and_auth_stay() {
    let (dir, web, daemon) = tls_daemon("alice", "correct horse");
    let d = dir.path();
    until_code(&daemon, &ALICE, 200, "no TLS answer");
    let (ok, failures, _) = reloads(&daemon, "ca.pem", "alice:correct horse");
    assert_eq!((ok, failures), (1.0, 0.0));

    // (a) A plain config written in place: it would serve plain HTTP with no password.
    write_in_place(
        &web,
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n",
        Duration::from_millis(50),
    );
    until_refused(&daemon, "turn TLS off");
    still_closed(&daemon, "plain config");

    // (b) Then an empty file, a key that is not the certificate's, no file, and SIGHUP.
    std::fs::create_dir(d.join("other")).unwrap();
    certificates(&d.join("other"));
    let mismatched = config("server.pem", "other/server.key", &[("alice", "x")]);
    type Step<'a> = (&'a str, &'a str, Box<dyn Fn() + 'a>);
    let steps: [Step; 4] = [
        (
            "empty",
            "is empty",
            Box::new(|| write_in_place(&web, "", Duration::ZERO)),
        ),
        (
            "mismatched key",
            "do not go together",
            Box::new(|| write_in_place(&web, &mismatched, Duration::from_millis(20))),
        ),
        (
            "deleted",
            "cannot read",
            Box::new(|| std::fs::remove_file(&web).unwrap()),
        ),
        (
            "SIGHUP",
            "cannot read",
            Box::new(|| unsafe {
                libc::kill(daemon.child.id() as i32, libc::SIGHUP);
            }),
        ),
    ];
    for (step, why, act) in steps {
        act();
        until_refused(&daemon, why);
        still_closed(&daemon, step);
    }
    // Each refusal is logged at ERROR and counted, none applied.
    let log = daemon.log_text();
    let refusals = log_lines(&daemon, &[REFUSED]);
    assert_eq!(log_lines(&daemon, &[REFUSED, "ERROR"]), refusals, "{log}");
    assert!(refusals >= 5, "{log}");
    assert_eq!(log_lines(&daemon, &["web config reloaded"]), 0, "{log}");
    let (_, failures, _) = reloads(&daemon, "ca.pem", "alice:correct horse");
    assert_eq!(failures as usize, refusals, "{log}");
    eprintln!("{refusals} refusals logged and counted");
}

#[test]
fn a_new_certificate_and_password_written_in_place_apply() {
    let (dir, web, daemon) = tls_daemon("alice", "correct horse");
    let d = dir.path();
    until_code(&daemon, &ALICE, 200, "no TLS answer");
    let (_, _, loaded_at) = reloads(&daemon, "ca.pem", "alice:correct horse");
    std::fs::create_dir(d.join("new")).unwrap();
    certificates(&d.join("new"));
    let written = Instant::now();
    write_in_place(
        &web,
        &config(
            "new/server.pem",
            "new/server.key",
            &[("alice", "battery staple")],
        ),
        Duration::from_millis(60),
    );
    let new = ["--cacert", "new/ca.pem", "-u", "alice:battery staple"];
    until_code(&daemon, &new, 200, "the new certificate and password");
    eprintln!("applied {:?} after the write began", written.elapsed());
    let old_password = ["--cacert", "new/ca.pem", "-u", "alice:correct horse"];
    assert_eq!(daemon.curl("https", "/healthz", &old_password).0, 401);
    // The old certificate is no longer served: a client trusting only its CA gives up.
    assert_eq!(daemon.curl("https", "/healthz", &ALICE).0, 0);
    let (ok, failures, at) = reloads(&daemon, "new/ca.pem", "alice:battery staple");
    assert_eq!((ok, failures), (1.0, 0.0), "{}", daemon.log_text());
    assert!(
        at > loaded_at,
        "success timestamp {at} not after {loaded_at}"
    );
}

/// SIGHUP lands while the file is half-written: the half (a valid file with TLS and one user)
/// must never be applied, only the whole (two users).
#[test]
fn a_file_seen_mid_write_is_not_applied_half_read() {
    let (_dir, web, daemon) = tls_daemon("alice", "correct horse");
    until_code(&daemon, &ALICE, 200, "no TLS answer");
    for round in 0..3 {
        let (first, second) = (format!("first{round}"), format!("second{round}"));
        let full = config(
            "server.pem",
            "server.key",
            &[(&first, "pw"), (&second, "pw")],
        );
        let cut = full.find(&format!("  {second}:")).unwrap();
        let mut f = std::fs::File::create(&web).unwrap();
        f.write_all(&full.as_bytes()[..cut]).unwrap();
        unsafe {
            libc::kill(daemon.child.id() as i32, libc::SIGHUP);
        }
        std::thread::sleep(Duration::from_millis(60));
        f.write_all(&full.as_bytes()[cut..]).unwrap();
        drop(f);
        let cred = format!("{second}:pw");
        until_code(
            &daemon,
            &["--cacert", "ca.pem", "-u", &cred],
            200,
            "the whole file was not applied",
        );
    }
    let log = daemon.log_text();
    assert!(log_lines(&daemon, &["web config reloaded"]) >= 3, "{log}");
    assert_eq!(
        log_lines(&daemon, &["web config reloaded", "basic_auth_users=1"]),
        0,
        "a half-written file was applied:\n{log}"
    );
}
