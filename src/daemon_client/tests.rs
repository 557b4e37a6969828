use super::*;

#[test]
fn urls_are_normalised_or_refused_with_the_value_named() {
    assert_eq!(
        normalize_url("node3:9477").as_deref(),
        Ok("http://node3:9477")
    );
    assert_eq!(
        normalize_url("http://10.0.0.2:9477/").as_deref(),
        Ok("http://10.0.0.2:9477")
    );
    assert_eq!(
        normalize_url("https://node3:9477/").as_deref(),
        Ok("https://node3:9477")
    );
    for bad in ["", "http://:9477", "node 3:9477"] {
        let e = normalize_url(bad).unwrap_err();
        assert!(
            e.contains("HOST:PORT") && e.contains(&format!("{bad:?}")),
            "{e}"
        );
    }
    let e = normalize_url("ftp://x").unwrap_err();
    assert!(e.contains("\"ftp://x\"") && e.contains("https://"), "{e}");
}

#[test]
fn credentials_come_from_a_file_or_the_environment_and_are_never_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("creds");
    std::fs::write(&f, "alice:s3cret\n").unwrap();
    let h = credentials(Some(&f), None).unwrap().unwrap();
    assert_eq!(h, "Basic YWxpY2U6czNjcmV0");
    // The file wins over the variable.
    assert_eq!(
        credentials(Some(&f), Some("bob:x".into()))
            .unwrap()
            .unwrap(),
        h
    );
    assert_eq!(
        credentials(None, Some("bob:x".into())).unwrap().unwrap(),
        "Basic Ym9iOng="
    );
    assert!(credentials(None, None).unwrap().is_none());
    let e = credentials(None, Some("s3cret-without-user".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains(BASIC_AUTH_ENV) && !e.contains("s3cret"), "{e}");
}
