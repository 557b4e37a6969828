//! The certificate recipe in docs/operations.md, run as it stands, makes certificates that curl
//! and `gpumon status` both accept; the one-liner most guides give (a self-signed certificate
//! that is its own CA) is refused by rustls, and `gpumon status` says why and where the recipe
//! is; every other failure names its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod stack;
mod tools;
mod web;

use std::path::Path;
use std::process::{Command, Output};

use common::BIN;
use web::{openssl, until_code, web_yml, Daemon};

const MARKER: &str =
    "<!-- certificate recipe: tests/certificates.rs runs this block as it stands -->";

/// The shell block after the marker in docs/operations.md.
fn recipe() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let after = &doc[doc.find(MARKER).expect("the recipe's marker") + MARKER.len()..];
    let body = after.split_once("```sh\n").unwrap().1;
    body.split_once("```").unwrap().0.to_string()
}

fn status(dir: &Path, port: u16, extra: &[&str]) -> Output {
    Command::new(BIN)
        .current_dir(dir)
        .args(["--config", "gpumon.toml", "status", "--connect"])
        .arg(format!("https://localhost:{port}"))
        .args(extra)
        .env_remove("GPUMON_BASIC_AUTH")
        .env_remove("GPUMON_CA_FILE")
        .env_remove("GPUMON_CREDENTIALS_FILE")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_documented_recipe_is_trusted_by_curl_and_gpumon() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("gpumon.toml"), "").unwrap();
    let out = Command::new("bash")
        .current_dir(d)
        .args(["-euo", "pipefail", "-c", &recipe()])
        .output()
        .unwrap();
    assert!(out.status.success(), "the recipe failed: {}", stderr(&out));
    let web = web_yml(d, "", "alice", "correct horse");
    let daemon = Daemon::start(d, &web);
    until_code(
        &daemon,
        &["--cacert", "ca.pem", "-u", "alice:correct horse"],
        200,
        "curl",
    );
    std::fs::write(d.join("creds"), "alice:correct horse\n").unwrap();
    let ok = status(
        d,
        daemon.port,
        &["--ca-file", "ca.pem", "--credentials-file", "creds"],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("NVIDIA H100"));

    // Without the CA: which CA is missing and the flag; without credentials: how to give them.
    let e = stderr(&status(d, daemon.port, &["--credentials-file", "creds"]));
    assert!(
        e.contains("not signed by the system's CAs") && e.contains("--ca-file"),
        "{e}"
    );
    let e = stderr(&status(d, daemon.port, &["--ca-file", "ca.pem"]));
    assert!(
        e.contains("HTTP 401") && e.contains("--credentials-file FILE"),
        "{e}"
    );
    std::fs::write(d.join("wrong"), "alice:battery staple\n").unwrap();
    let e = stderr(&status(
        d,
        daemon.port,
        &["--ca-file", "ca.pem", "--credentials-file", "wrong"],
    ));
    assert!(
        e.contains("refused the user and password from --credentials-file wrong"),
        "{e}"
    );
}

#[test]
fn a_certificate_that_is_its_own_ca_is_refused_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("gpumon.toml"), "").unwrap();
    // The usual one-liner: self-signed, and so CA:TRUE.
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.pem",
        ],
    );
    let web = web_yml(d, "", "alice", "correct horse");
    let daemon = Daemon::start(d, &web);
    // curl takes it as its own anchor...
    until_code(
        &daemon,
        &["--cacert", "server.pem", "-u", "alice:correct horse"],
        200,
        "curl",
    );
    std::fs::write(d.join("creds"), "alice:correct horse\n").unwrap();
    // ...rustls does not, and gpumon says what to do instead.
    let out = status(
        d,
        daemon.port,
        &["--ca-file", "server.pem", "--credentials-file", "creds"],
    );
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("itself a CA certificate") && e.contains("docs/operations.md, \"Certificates\""),
        "{e}"
    );
}
