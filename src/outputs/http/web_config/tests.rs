use std::path::Path;
use std::process::Command;

use super::*;

/// A self-signed certificate and its key for localhost, made by openssl.
pub(super) fn cert(dir: &Path) {
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .expect("openssl");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

fn load(dir: &Path, yaml: &str) -> Result<WebConfig, WebConfigError> {
    let p = dir.join("web.yml");
    std::fs::write(&p, yaml).unwrap();
    WebConfig::load(&p)
}

fn error(dir: &Path, yaml: &str) -> String {
    match load(dir, yaml) {
        Ok(_) => panic!("accepted: {yaml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tls_from_files_named_relative_to_the_config() {
    let dir = tempfile::tempdir().unwrap();
    cert(dir.path());
    let c = load(
        dir.path(),
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  min_version: TLS13\n",
    )
    .unwrap();
    let tls = c.tls.expect("TLS on");
    assert_eq!(tls.alpn_protocols, vec![b"http/1.1".to_vec()]);
    assert!(!c.auth.enabled());
    // Empty file: plain HTTP, like no file.
    let c = load(dir.path(), "").unwrap();
    assert!(c.tls.is_none() && !c.auth.enabled() && c.headers.is_empty());
}

#[test]
fn every_refusal_names_the_key_and_why() {
    let dir = tempfile::tempdir().unwrap();
    cert(dir.path());
    let d = dir.path();
    let tls = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n";
    for (yaml, key, why) in [
        ("tls_srever_config: {}\n", "(yaml)", "unknown field"),
        (
            "tls_server_config:\n  cert_file: nope.pem\n  key_file: key.pem\n",
            "tls_server_config.cert_file",
            "nope.pem",
        ),
        (
            "tls_server_config:\n  cert_file: cert.pem\n",
            "tls_server_config.key_file",
            "missing",
        ),
        (
            &format!("{tls}  client_auth_type: RequireAnyClientCert\n"),
            "tls_server_config.client_auth_type",
            "nobody verified",
        ),
        (
            &format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"),
            "tls_server_config.client_ca_file",
            "missing",
        ),
        (
            &format!("{tls}  client_auth_type: Sometimes\n"),
            "tls_server_config.client_auth_type",
            "\"Sometimes\"",
        ),
        (
            &format!("{tls}  min_version: TLS11\n"),
            "tls_server_config.min_version",
            "TLS11",
        ),
        (
            &format!("{tls}  min_version: TLS13\n  max_version: TLS12\n"),
            "tls_server_config.min_version",
            "above",
        ),
        (
            &format!("{tls}  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n"),
            "tls_server_config.cipher_suites",
            "TLS_RSA_WITH_AES_128_CBC_SHA",
        ),
        (
            &format!("{tls}  client_allowed_sans: [a.example]\n"),
            "tls_server_config.client_allowed_sans",
            "not supported",
        ),
        (
            "basic_auth_users:\n  alice: hunter2\n",
            "basic_auth_users.alice",
            "bcrypt",
        ),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
            "http_server_config.headers",
            "allow",
        ),
        (
            "http_server_config:\n  headers:\n    X-Powered-By: me\n",
            "http_server_config.headers",
            "X-Powered-By",
        ),
        (
            "rate_limit:\n  interval: soon\n",
            "rate_limit.interval",
            "soon",
        ),
    ] {
        let e = error(d, yaml);
        assert!(
            e.contains(&format!(": {key}: ")) && e.contains(why),
            "{yaml} -> {e}"
        );
    }
    // A secret is never quoted back.
    let e = error(
        d,
        "tls_server_config:\n  cert_file: cert.pem\n  key: \"s3cret-not-pem\"\n",
    );
    assert!(!e.contains("s3cret"), "{e}");
}

#[test]
fn suites_curves_headers_and_rate_are_taken() {
    let dir = tempfile::tempdir().unwrap();
    cert(dir.path());
    let c = load(
        dir.path(),
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305]\n  curve_preferences: [X25519]\n  prefer_server_cipher_suites: false\nhttp_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n    Content-Security-Policy: \"\"\nrate_limit:\n  interval: 100ms\n  burst: 5\n",
    )
    .unwrap();
    let tls = c.tls.unwrap();
    assert!(!tls.ignore_client_order);
    let names: Vec<_> = c
        .headers
        .iter()
        .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        ["x-content-type-options: nosniff", "x-frame-options: deny"]
    );
    let rate = c.rate_limit.unwrap();
    assert_eq!((rate.every, rate.burst), (Duration::from_millis(100), 5));
    assert_eq!(
        (0..7).filter(|_| rate.admit()).count(),
        5,
        "a burst of 5, then one per 100 ms"
    );
}

#[test]
fn basic_auth_checks_bcrypt_and_remembers_what_it_verified() {
    let hash = bcrypt::hash("correct horse", 4).unwrap();
    let auth = Auth::new([("alice".to_string(), hash)].into());
    let header = |user: &str, pw: &str| {
        format!(
            "Basic {}",
            base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                format!("{user}:{pw}")
            )
        )
    };
    let right = header("alice", "correct horse");
    assert_eq!(
        auth.quick(Some(right.as_bytes())),
        None,
        "not verified yet: bcrypt needed"
    );
    assert_eq!(auth.check(Some(right.as_bytes())), Verdict::Allowed);
    assert_eq!(auth.check(Some(right.as_bytes())), Verdict::Allowed);
    assert_eq!(
        auth.quick(Some(right.as_bytes())),
        Some(Verdict::Allowed),
        "remembered"
    );
    assert_eq!(auth.quick(Some(b"Bearer abc")), Some(Verdict::Denied));
    assert_eq!(
        auth.check(Some(header("alice", "wrong").as_bytes())),
        Verdict::Denied
    );
    assert_eq!(
        auth.check(Some(header("mallory", "correct horse").as_bytes())),
        Verdict::Denied
    );
    assert_eq!(auth.check(None), Verdict::Denied);
    assert_eq!(auth.check(Some(b"Bearer abc")), Verdict::Denied);
    assert_eq!(auth.check(Some(b"Basic !!!")), Verdict::Denied);
    assert_eq!(Auth::default().check(None), Verdict::Open);
}

#[test]
fn a_bad_reload_keeps_the_config_in_force_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("web.yml");
    let hash = bcrypt::hash("pw", 4).unwrap();
    std::fs::write(&p, format!("basic_auth_users:\n  alice: \"{hash}\"\n")).unwrap();
    let w = WebConfigWatch::new(Some(p.clone())).unwrap();
    let stats = w.reload_stats().expect("a file: reloads are counted");
    assert!(w.current().auth.enabled() && stats.last_successful());
    std::fs::write(&p, "basic_auth_users: [broken\n").unwrap();
    w.reload();
    assert!(w.current().auth.enabled(), "the old config stays");
    assert_eq!((stats.last_successful(), stats.failures()), (false, 1));
    std::fs::write(&p, format!("basic_auth_users:\n  bob: \"{hash}\"\n")).unwrap();
    w.reload();
    assert_eq!(w.current().auth.users(), 1);
    assert!(stats.last_successful(), "a good file takes over");
    // At start, a bad file is an error.
    std::fs::write(&p, "nope: 1\n").unwrap();
    assert!(WebConfigWatch::new(Some(p)).is_err());
    assert!(WebConfigWatch::new(None).unwrap().reload_stats().is_none());
}
