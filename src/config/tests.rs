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
