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
        crate::core::store::sessions::AttributionPolicy::default()
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

#[test]
fn log_level_must_name_real_levels() {
    for ok in [
        "info",
        "WARN",
        "off",
        "info,gpumon::sources::ingest=debug",
        "gpumon=trace",
        "warn,gpumon[conn{pid=7}]=debug",
        "gpumon[conn]",
        "info,",
    ] {
        let c = Config {
            log_level: ok.into(),
            ..Config::default()
        };
        assert!(c.validate().is_ok(), "{ok}: {:?}", c.validate());
    }
    // Each of these parsed as a target name and silenced every log line, errors included.
    for (bad, hint) in [
        ("warning", "\"warn\""),
        ("verbose", "\"debug\""),
        ("", "empty"),
        ("  ", "empty"),
        ("gpumon", "gpumon=debug"),
        ("gpumon=warning", "\"warn\""),
        ("info,gpumon::sources::ingest=loud", "loud"),
        ("info,errors", "\"error\""),
    ] {
        let err = Config::parse(&format!("log_level = {bad:?}\n"), Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("log_level") && err.contains(&format!("{bad:?}")) && err.contains(hint),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn ingest_limits_are_read_and_bounded() {
    let c = Config::parse(
        "[ingest]\nhello_timeout_seconds = 2\nidle_timeout_seconds = 0.5\nmax_connections_per_uid = 8\nreserved_connections = 4\n",
        Path::new("t.toml"),
    )
    .unwrap();
    assert_eq!(
        (
            c.ingest.hello_timeout_seconds,
            c.ingest.idle_timeout_seconds,
            c.ingest.max_connections_per_uid,
            c.ingest.reserved_connections
        ),
        (2.0, 0.5, 8, 4)
    );
    assert!(Config::parse(
        "[ingest]\nmax_connections = 2\nreserved_connections = 1\n",
        Path::new("t.toml")
    )
    .is_ok());
    // A reserve of every slot leaves none to say hello in: both values are named.
    for text in [
        "max_connections = 2",
        "max_connections = 16\nreserved_connections = 16",
        "reserved_connections = 2000000",
    ] {
        let err = Config::parse(&format!("[ingest]\n{text}\n"), Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        let max = if text.contains("2000000") {
            1024
        } else if text.contains("16") {
            16
        } else {
            2
        };
        assert!(
            err.contains("ingest.reserved_connections")
                && err.contains(&format!("ingest.max_connections = {max}")),
            "{text}: {err}"
        );
    }
    for (line, key, value) in [
        (
            "hello_timeout_seconds = 0",
            "ingest.hello_timeout_seconds",
            "0",
        ),
        (
            "hello_timeout_seconds = nan",
            "ingest.hello_timeout_seconds",
            "NaN",
        ),
        (
            "hello_timeout_seconds = 3601",
            "ingest.hello_timeout_seconds",
            "3601",
        ),
        (
            "idle_timeout_seconds = -1",
            "ingest.idle_timeout_seconds",
            "-1",
        ),
        (
            "idle_timeout_seconds = inf",
            "ingest.idle_timeout_seconds",
            "inf",
        ),
        (
            "max_connections_per_uid = 0",
            "ingest.max_connections_per_uid",
            "0",
        ),
        (
            "reserved_connections = 1024",
            "ingest.reserved_connections",
            "1024",
        ),
        ("max_connections = 0", "ingest.max_connections", "0"),
    ] {
        let err = Config::parse(&format!("[ingest]\n{line}\n"), Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(key) && err.contains(&format!("\"{value}\"")),
            "{line}: {err}"
        );
    }
}

#[test]
fn record_errors_name_the_key_that_was_set() {
    for (text, key, value) in [
        ("dir = \"\"", "record.dir", "\"\""),
        ("dir = \"traces\"", "record.dir", "\"traces\""),
        ("dir = \"./traces\"", "record.dir", "\"./traces\""),
        ("max_total_bytes = 0", "record.max_total_bytes", "\"0\""),
        (
            "max_total_bytes = 1000000",
            "record.max_total_bytes",
            "\"1000000\"",
        ),
        ("max_file_bytes = 100", "record.max_file_bytes", "\"100\""),
        (
            "max_file_bytes = 2000000000\nmax_total_bytes = 1000000000",
            "record.max_file_bytes",
            "\"2000000000\"",
        ),
    ] {
        let err = Config::parse(&format!("[record]\n{text}\n"), Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key) && err.contains(value), "{text}: {err}");
    }
    let c = Config::parse(
        "[record]\ndir = \"/var/lib/gpumon/traces\"\n",
        Path::new("t.toml"),
    );
    assert!(c.is_ok(), "{c:?}");
}

#[test]
fn variables_for_file_only_keys_are_errors() {
    let ok = env::check(["GPUMON_LOG_LEVEL", "GPUMON_SOCKET", "GPUMON_JOB", "PATH"]);
    assert!(ok.is_ok(), "{ok:?}");
    for (var, key) in [
        ("GPUMON_INGEST_MAX_CONNECTIONS", "ingest.max_connections"),
        ("GPUMON_MAX_CONNECTIONS", "ingest.max_connections"),
        (
            "GPUMON_HELLO_TIMEOUT_SECONDS",
            "ingest.hello_timeout_seconds",
        ),
        ("GPUMON_HISTORY_GPU_POINTS", "history.gpu_points"),
        ("GPUMON_RECORD_MAX_TOTAL_BYTES", "record.max_total_bytes"),
        ("GPUMON_CRASH_HOLD", "detect.crash_hold"),
        ("GPUMON_ATTRIBUTION_ENABLED", "attribution.enabled"),
        ("GPUMON_RESEND_INTERVAL", "alerts.resend_interval"),
        // A key that has a variable, spelt the other way: the error names the right one.
        ("GPUMON_ALERTS_WEBHOOK_URL", "GPUMON_WEBHOOK_URL"),
    ] {
        let err = env::check(["PATH", var]).unwrap_err().to_string();
        assert!(err.contains(var) && err.contains(key), "{var}: {err}");
    }
    // Every key of the config is covered: the file-only ones and those with a variable.
    let keys = env::all_keys();
    assert!(keys.contains(&"ingest.reserved_connections".to_string()));
    assert!(keys.contains(&"record.dir".to_string()));
}

#[test]
fn the_variables_here_are_the_ones_the_flags_read() {
    use clap::CommandFactory;
    let cli = crate::cli::Cli::command();
    let mut from_flags: Vec<String> = cli
        .get_arguments()
        .chain(
            cli.get_subcommands()
                .filter(|c| c.get_name() == "daemon")
                .flat_map(|c| c.get_arguments()),
        )
        .filter_map(|a| a.get_env()?.to_str().map(str::to_string))
        .filter(|v| v != "GPUMON_CONFIG")
        .collect();
    from_flags.sort();
    from_flags.dedup();
    let mut here: Vec<String> = env::ENV_KEYS.iter().map(|(_, v)| v.to_string()).collect();
    here.sort();
    assert_eq!(from_flags, here);
}

#[test]
fn http_limits_are_read_and_bounded() {
    let c = Config::parse(
        "[http]\nconnection_limit = 64\nheader_timeout_seconds = 2\nkeepalive_timeout_seconds = 0.5\nmax_request_head_bytes = 8192\nshutdown_grace_seconds = 0\n",
        Path::new("t.toml"),
    )
    .unwrap();
    let h = &c.http;
    assert_eq!(
        (
            h.connection_limit,
            h.header_timeout_seconds,
            h.keepalive_timeout_seconds,
            h.max_request_head_bytes,
            h.shutdown_grace_seconds
        ),
        (64, 2.0, 0.5, 8192, 0.0)
    );
    let limits = crate::outputs::http::HttpLimits::from(h);
    assert_eq!(limits.header_timeout, Duration::from_secs(2));
    assert_eq!(limits.drain, Duration::ZERO);
    for (line, key, value) in [
        ("connection_limit = 0", "http.connection_limit", "0"),
        (
            "header_timeout_seconds = 0",
            "http.header_timeout_seconds",
            "0",
        ),
        (
            "header_timeout_seconds = nan",
            "http.header_timeout_seconds",
            "NaN",
        ),
        (
            "keepalive_timeout_seconds = inf",
            "http.keepalive_timeout_seconds",
            "inf",
        ),
        (
            "shutdown_grace_seconds = -1",
            "http.shutdown_grace_seconds",
            "-1",
        ),
        (
            "max_request_head_bytes = 4096",
            "http.max_request_head_bytes",
            "4096",
        ),
        (
            "max_request_head_bytes = 2000000",
            "http.max_request_head_bytes",
            "2000000",
        ),
    ] {
        let err = Config::parse(&format!("[http]\n{line}\n"), Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(key) && err.contains(&format!("\"{value}\"")),
            "{line}: {err}"
        );
    }
    let err = Config::parse("[http]\nmax_connections = 5\n", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_connections"), "{err}");
}

#[test]
fn kubernetes_section() {
    let c = Config::parse(
        "[kubernetes]\nkubelet_url = \"https://${NODE_IP}:10250\"\ninsecure_skip_verify = true\n",
        Path::new("t.toml"),
    )
    .unwrap();
    assert_eq!(
        c.kubernetes.kubelet_url.as_deref(),
        Some("https://${NODE_IP}:10250")
    );
    assert!(c.kubernetes.insecure_skip_verify);
    assert_eq!(
        c.kubernetes.token_file,
        Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token")
    );
    for (url, why) in [
        ("10.0.0.1:10250", "https://"),
        ("https://${NODE_IP:10250", "unclosed"),
        ("https://${node-ip}:10250", "variable name"),
    ] {
        let err = Config::parse(
            &format!("[kubernetes]\nkubelet_url = \"{url}\"\n"),
            Path::new("t.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("kubernetes.kubelet_url") && err.contains(why),
            "{url}: {err}"
        );
    }
    let err = Config::parse("[kubernetes]\nkubelet = \"x\"\n", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("kubelet"), "{err}");
}

#[test]
fn an_old_file_with_process_points_still_loads() {
    // Per-process history is gone; a config written for an older daemon must not stop it.
    let c = Config::parse("[history]\nprocess_points = 300\n", Path::new("old")).unwrap();
    assert_eq!(c.history.process_points, Some(300));
    assert_eq!(c.history.gpu_points, 3600);
}

#[test]
fn oom_settings_are_read_and_bounded() {
    let c = Config::parse(
        "[oom]\narm = false\narm_eta_seconds = 600\narm_seconds = 120.5\nmax_entries = 100000\npeak_after_steps = 0\nrearm_seconds = 60\n",
        Path::new("t.toml"),
    )
    .unwrap();
    let p = c.oom();
    assert!(!p.arm);
    assert_eq!(
        (p.arm_eta_seconds, p.arm_seconds, p.rearm_seconds),
        (600.0, 120.5, 60.0)
    );
    assert_eq!((p.max_entries, p.peak_after_steps), (100_000, 0));
    let d = Config::default().oom();
    assert_eq!(d, crate::core::store::sessions::OomPolicy::default());
    assert!(d.arm);
    assert_eq!(
        (d.arm_eta_seconds, d.arm_seconds, d.rearm_seconds),
        (3600.0, 900.0, 3600.0)
    );
    assert_eq!((d.max_entries, d.peak_after_steps), (20_000, 20));
    for (line, key, value) in [
        ("max_entries = 100001", "oom.max_entries", "100001"),
        ("max_entries = 0", "oom.max_entries", "0"),
        ("arm_seconds = 5", "oom.arm_seconds", "5"),
        ("arm_seconds = nan", "oom.arm_seconds", "NaN"),
        ("arm_eta_seconds = -1", "oom.arm_eta_seconds", "-1"),
        ("rearm_seconds = inf", "oom.rearm_seconds", "inf"),
        (
            "peak_after_steps = 2000000",
            "oom.peak_after_steps",
            "2000000",
        ),
    ] {
        let err = Config::parse(&format!("[oom]\n{line}\n"), Path::new("t.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(key) && err.contains(value), "{line}: {err}");
    }
    let err = Config::parse("[oom]\narmed = true\n", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("armed"), "{err}");
    let err = env::check(["GPUMON_OOM_ARM"]).unwrap_err().to_string();
    assert!(err.contains("oom.arm"), "{err}");
}

#[test]
fn a_parts_settings_error_reads_the_same_from_config() {
    let http = HttpConfig {
        connection_limit: 0,
        ..HttpConfig::default()
    };
    let e = http.validate().unwrap_err();
    let text = "invalid http.connection_limit = \"0\": keep between 1 and 1000000, and well under the open-file limit";
    assert_eq!(e.to_string(), text);
    assert_eq!(ConfigError::from(e).to_string(), text);

    let record = RecordConfig {
        max_files: 0,
        ..RecordConfig::default()
    };
    let e = record.validate().unwrap_err();
    let text = "invalid record.max_files = \"0\": set it between 1 and 1000000";
    assert_eq!(e.to_string(), text);
    assert_eq!(ConfigError::from(e).to_string(), text);

    let kubernetes = KubernetesConfig {
        kubelet_url: Some("10.0.0.1:10250".into()),
        ..KubernetesConfig::default()
    };
    let e = kubernetes.validate().unwrap_err();
    let text = "invalid kubernetes.kubelet_url = \"10.0.0.1:10250\": use the kubelet's https:// URL, e.g. \"https://${NODE_IP}:10250\"";
    assert_eq!(e.to_string(), text);
    assert_eq!(ConfigError::from(e).to_string(), text);
}
