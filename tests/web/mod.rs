//! The web config tests' daemon: certificates made by openssl, a web config file with TLS and
//! basic auth, the real binary serving it, and curl to ask it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::common::{self, fake_lib, scenario, BIN};
use super::stack;

pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and a client certificate.
pub fn certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-days",
                "2",
                "-subj",
                "/CN=gpumon test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        ]
        .concat(),
    );
    for (name, ext) in [
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ] {
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(
            dir,
            &[
                &["req"][..],
                &ec,
                &[
                    "-subj",
                    &format!("/CN={name}"),
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                ],
            ]
            .concat(),
        );
        std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &pem,
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }
}

pub fn web_yml(dir: &Path, extra_tls: &str, user: &str, password: &str) -> PathBuf {
    let hash = bcrypt::hash(password, 4).unwrap();
    let p = dir.join("web.yml");
    std::fs::write(
        &p,
        format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n{extra_tls}http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\nbasic_auth_users:\n  {user}: \"{hash}\"\n"
        ),
    )
    .unwrap();
    p
}

pub struct Daemon {
    pub child: Child,
    pub port: u16,
    pub dir: PathBuf,
    /// The daemon's stderr.
    pub log: PathBuf,
}

impl Daemon {
    pub fn start(dir: &Path, web: &Path) -> Self {
        let port = stack::free_port();
        let log = dir.join(format!("daemon-{port}.log"));
        let child = Command::new(BIN)
            .arg("--config")
            .arg(dir.join("gpumon.toml"))
            .args(["daemon", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--nvml-lib")
            .arg(fake_lib())
            .arg("--socket")
            .arg(dir.join(format!("ingest-{port}.sock")))
            .arg("--web.config.file")
            .arg(web)
            .env("FAKE_NVML_SCENARIO", scenario("two_gpus"))
            .env_remove("GPUMON_LISTEN")
            .env("GPUMON_LOG_LEVEL", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Self {
            child,
            port,
            dir: dir.to_path_buf(),
            log,
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "daemon did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// curl with `args` against `path`: (HTTP status or 0 when no response, body, exit code).
    pub fn curl(&self, scheme: &str, path: &str, args: &[&str]) -> (u16, String, i32) {
        let out: Output = Command::new("curl")
            .current_dir(&self.dir)
            .args([
                "-sS",
                "--max-time",
                "5",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
                "-D",
                "headers.txt",
            ])
            .args(args)
            .arg(format!("{scheme}://127.0.0.1:{}{path}", self.port))
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (
            code.trim().parse().unwrap_or(0),
            body.to_string(),
            out.status.code().unwrap_or(-1),
        )
    }

    pub fn metrics(&self, user: &str, password: &str) -> String {
        let cred = format!("{user}:{password}");
        let (code, body, _) = self.curl("https", "/metrics", &["--cacert", "ca.pem", "-u", &cred]);
        assert_eq!(code, 200, "{body}");
        body
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn sample(metrics: &str, series: &str) -> f64 {
    common::sample(metrics, series).unwrap_or_else(|| panic!("no {series}"))
}

/// A daemon serving TLS from fresh certificates with basic auth for one user: (its directory,
/// the web config file, the daemon).
pub fn tls_daemon(user: &str, password: &str) -> (tempfile::TempDir, PathBuf, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("gpumon.toml"), "").unwrap();
    certificates(d);
    let web = web_yml(d, "", user, password);
    let daemon = Daemon::start(d, &web);
    (dir, web, daemon)
}

impl Daemon {
    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Waits up to 10 s for curl with `args` to get `code` from /healthz.
pub fn until_code(daemon: &Daemon, args: &[&str], code: u16, what: &str) {
    let start = Instant::now();
    while daemon.curl("https", "/healthz", args).0 != code {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
