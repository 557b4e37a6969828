use super::*;

#[test]
fn example_parses_to_the_defaults() {
    let parsed = Config::parse(&example(), Path::new("example")).unwrap();
    assert_eq!(parsed, Config::default());
}

#[test]
fn shipped_example_is_not_stale() {
    let shipped = include_str!("../../gpumon.example.toml");
    assert_eq!(
        shipped,
        example(),
        "gpumon.example.toml is stale: run `cargo run -- config > gpumon.example.toml`"
    );
}

#[test]
fn every_key_is_documented_in_the_example() {
    // Serialise a config with every optional set, so each key appears.
    let full = Config {
        socket: Some("/x".into()),
        ..Config::default()
    };
    let table: toml::Table = toml::from_str(&toml::to_string(&full).unwrap()).unwrap();
    let text = example();
    for (key, value) in &table {
        if let toml::Value::Table(inner) = value {
            assert!(text.contains(&format!("[{key}]")), "[{key}] missing");
            for k in inner.keys() {
                assert!(text.contains(&format!("{k} =")), "{key}.{k} missing");
            }
        } else {
            assert!(
                text.contains(&format!("{key} =")),
                "{key} missing from example"
            );
        }
    }
}

#[test]
fn unknown_key_is_named_in_the_error() {
    let err = Config::parse(
        "listen = \"127.0.0.1:1\"\nintervall = \"2s\"\n",
        Path::new("t.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("intervall"), "{err}");
    assert!(err.contains("t.toml"), "{err}");
    let err = Config::parse("[history]\ngpu_point = 3\n", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("gpu_point"), "{err}");
}

#[test]
fn bad_values_are_named() {
    let err = Config::parse("interval = \"soon\"\n", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("soon"), "{err}");
    let err = Config::parse("interval = \"1ms\"\n", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("interval") && err.contains("1ms"), "{err}");
    let err = Config::parse("listen = \"nowhere\"\n", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("listen") || err.contains("nowhere"), "{err}");
}

#[test]
fn missing_default_file_means_defaults_but_missing_explicit_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Config::load(Some(&dir.path().join("absent.toml"))).unwrap_err();
    assert!(err.to_string().contains("absent.toml"));
}

#[test]
fn attribution_settings_are_read_and_bounded() {
    let c = Config::parse(
        "[attribution]\nenabled = false\nwindow_steps = 50\nwindow_seconds = 30\nmax_entries = 100000\ntop = 20\ncooldown_seconds = 0.5\n",
        Path::new("t.toml"),
    )
    .unwrap();
    let p = c.attribution();
    assert!(!p.enabled);
    assert_eq!((p.window_steps, p.max_entries, p.top), (50, 100_000, 20));
    // Seconds may be written as integers too.
    assert_eq!((p.window_seconds, p.cooldown_seconds), (30.0, 0.5));
    assert_eq!(
        Config::default().attribution(),
        crate::store::sessions::AttributionPolicy::default()
    );
    for (line, key, value) in [
        ("max_entries = 100001", "attribution.max_entries", "100001"),
        ("max_entries = 0", "attribution.max_entries", "0"),
        ("top = 0", "attribution.top", "0"),
        ("top = 21", "attribution.top", "21"),
        ("window_steps = 0", "attribution.window_steps", "0"),
        ("window_seconds = 0.5", "attribution.window_seconds", "0.5"),
        ("window_seconds = nan", "attribution.window_seconds", "NaN"),
        (
            "cooldown_seconds = -1",
            "attribution.cooldown_seconds",
            "-1",
        ),
        (
            "cooldown_seconds = inf",
            "attribution.cooldown_seconds",
            "inf",
        ),
    ] {
        let err = Config::parse(&format!("[attribution]\n{line}\n"), Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key) && err.contains(value), "{line}: {err}");
    }
    let err = Config::parse("[attribution]\nwindow = 3\n", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("window"), "{err}");
}
