use std::path::{Path, PathBuf};

use super::super::tests::cert;
use super::*;

fn users(names: &[&str]) -> String {
    let hash = bcrypt::hash("pw", 4).unwrap();
    let mut s = String::from("basic_auth_users:\n");
    for n in names {
        s.push_str(&format!("  {n}: \"{hash}\"\n"));
    }
    s
}

const TLS: &str = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n";

/// A directory with a certificate, and a web config with TLS and basic auth loaded from it.
fn tls_and_auth() -> (tempfile::TempDir, PathBuf, WebConfig) {
    let dir = tempfile::tempdir().unwrap();
    cert(dir.path());
    let p = dir.path().join("web.yml");
    std::fs::write(&p, format!("{TLS}{}", users(&["alice"]))).unwrap();
    let c = WebConfig::load(&p).unwrap();
    assert!(c.tls.is_some() && c.auth.enabled());
    (dir, p, c)
}

fn refused(p: &Path, current: &WebConfig, content: Option<&str>) -> String {
    match content {
        Some(text) => std::fs::write(p, text).unwrap(),
        None => std::fs::remove_file(p).unwrap(),
    }
    match read_stable(p, current) {
        Ok(_) => panic!("applied: {content:?}"),
        Err(e) => e,
    }
}

#[test]
fn no_reload_turns_tls_or_auth_off_or_applies_a_broken_file() {
    let (dir, p, current) = tls_and_auth();
    let plain_users = users(&["alice"]);
    for (content, why) in [
        ("", "is empty"),
        (" \n", "is empty"),
        (&plain_users[..], "turn TLS off"),
        (TLS, "turn basic auth off"),
        ("http_server_config:\n  headers: {}\n", "turn TLS off"),
        ("tls_server_config:\n  cert_file: cert.pem\n", "key_file"),
        (
            "tls_server_config:\n  cert_file: cert.pem\n  key_fi",
            "(yaml)",
        ),
    ] {
        let e = refused(&p, &current, Some(content));
        assert!(e.contains(why) && e.contains("web.yml"), "{content:?}: {e}");
    }
    let e = refused(&p, &current, None);
    assert!(e.contains("cannot read"), "{e}");
    // A key that is not the certificate's.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    cert(&other);
    std::fs::copy(other.join("key.pem"), dir.path().join("key.pem")).unwrap();
    let e = refused(&p, &current, Some(&format!("{TLS}{}", users(&["alice"]))));
    assert!(e.contains("do not go together"), "{e}");
}

#[test]
fn a_change_that_keeps_tls_and_auth_applies() {
    let (_dir, p, current) = tls_and_auth();
    std::fs::write(&p, format!("{TLS}{}", users(&["bob", "carol"]))).unwrap();
    let c = read_stable(&p, &current).unwrap();
    assert!(c.tls.is_some());
    assert_eq!(c.auth.users(), 2);
    // Without TLS or auth in force, adding them (or changing nothing) applies too.
    let plain = WebConfig::plain();
    assert_eq!(read_stable(&p, &plain).unwrap().auth.users(), 2);
}

#[test]
fn required_client_certificates_stay_required() {
    let (dir, p, _) = tls_and_auth();
    std::fs::copy(dir.path().join("cert.pem"), dir.path().join("ca.pem")).unwrap();
    let required = format!(
        "{TLS}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n{}",
        users(&["alice"])
    );
    std::fs::write(&p, &required).unwrap();
    let current = WebConfig::load(&p).unwrap();
    assert!(current.client_certs);
    let e = refused(&p, &current, Some(&format!("{TLS}{}", users(&["alice"]))));
    assert!(e.contains("client certificates"), "{e}");
    std::fs::write(&p, &required).unwrap();
    assert!(read_stable(&p, &current).unwrap().client_certs);
}

/// `cat new > web.yml` as a slow writer does it: truncated, half written, then the rest.
#[test]
fn a_file_mid_write_is_read_once_it_holds_still() {
    let (_dir, p, current) = tls_and_auth();
    let full = format!("{TLS}{}", users(&["bob", "carol"]));
    // Cut after bob's line: a valid file with TLS and one user, which must never apply.
    let half = &full[..full.find("  carol").unwrap()];
    std::fs::write(&p, half).unwrap();
    // The rest is written while the reader waits for the file to hold still.
    let mut written = false;
    let c = read_stable_with(&p, &current, || {
        if !written {
            std::fs::write(&p, &full).unwrap();
            written = true;
        }
    })
    .unwrap();
    assert_eq!(c.auth.users(), 2, "the half-written file was applied");
    // And with the real wait, a writer that finished before: read at once.
    let c = read_stable(&p, &current).unwrap();
    assert_eq!(c.auth.users(), 2);
}

#[test]
fn a_file_that_never_holds_still_is_refused_in_bounded_time() {
    let (_dir, p, current) = tls_and_auth();
    // A writer that changes the file during every wait: refused after ATTEMPTS looks.
    let mut waits = 0u32;
    let e = read_stable_with(&p, &current, || {
        waits += 1;
        let names: Vec<String> = (0..=waits % 3).map(|i| format!("u{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        std::fs::write(&p, format!("{TLS}{}", users(&names))).unwrap();
    })
    .err()
    .expect("a file that never held still was applied");
    assert!(e.contains("still changing"), "{e}");
    assert_eq!(waits, ATTEMPTS);
}
