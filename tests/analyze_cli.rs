//! `gpumon analyze` as a user runs it: exit codes, bad lines named by file and line, text output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");
const GIB: u64 = 1 << 30;
const TOTAL: u64 = 85_520_809_984;

fn analyze(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("analyze")
        .args(args)
        .output()
        .unwrap()
}

/// A trace with `leak` bytes of floor growth per step after step 500, ending with bye.
fn trace(leak: u64, steps: u64) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    writeln!(f, r#"{{"type":"hello","v":1,"pid":1,"job":"ft","rank":2}}"#).unwrap();
    for s in 0..steps {
        let floor = 20 * GIB + s.saturating_sub(500) * leak + (s * 7919 % 97) * (1 << 20);
        let peak = floor + 10 * GIB;
        let reserved = peak + GIB;
        writeln!(
            f,
            r#"{{"type":"sample","ts":{},"step":{s},"stats":{{"allocated_bytes.all.current":{floor},"allocated_bytes.all.peak":{peak},"reserved_bytes.all.current":{reserved}}},"device_free":{},"device_total":{TOTAL}}}"#,
            1_763_700_000 + s,
            TOTAL - reserved - GIB
        )
        .unwrap();
        if s == 3000 {
            writeln!(f, "{{not json").unwrap();
        }
    }
    writeln!(f, r#"{{"type":"bye","ts":1763799999}}"#).unwrap();
    f
}

#[test]
fn a_healthy_trace_exits_0_and_a_bad_line_is_named_with_its_file_and_line() {
    let t = trace(0, 5000);
    let out = analyze(&[t.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("job=ft rank=2  5000 samples"), "{text}");
    assert!(text.contains("no findings"), "{text}");
    // hello is line 1, step s is line s+2, the bad line follows step 3000.
    assert!(
        text.contains("bad line 3003:") && text.contains("bad_json"),
        "{text}"
    );
    assert!(text.contains(t.path().to_str().unwrap()));
}

#[test]
fn a_leaking_trace_exits_1_with_the_contract_json() {
    let t = trace(4 << 20, 6000);
    let out = analyze(&["--format", "json", t.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tr = &v["traces"][0];
    assert_eq!(tr["job"], "ft");
    assert_eq!(tr["rank"], 2);
    assert_eq!(tr["samples"], 6000);
    let leak = &tr["findings"][0];
    assert_eq!(leak["kind"], "leak");
    let first = leak["first_step"].as_u64().unwrap();
    assert!((500..1500).contains(&first), "first_step {first}");
    let slope = leak["slope_bytes_per_step"].as_f64().unwrap();
    assert!(
        (slope / (4 << 20) as f64 - 1.0).abs() < 0.1,
        "slope {slope}"
    );
    for key in [
        "first_ts",
        "growth_bytes",
        "confidence",
        "oom_eta_steps",
        "oom_eta_seconds",
        "message",
    ] {
        assert!(!leak[key].is_null(), "{key} missing: {leak}");
    }
    assert!(leak["message"]
        .as_str()
        .unwrap()
        .starts_with("allocated floor grows 4.0 MiB/step since step"));
}

#[test]
fn an_unreadable_trace_exits_2_naming_it_and_the_others_are_still_analysed() {
    let good = trace(0, 200);
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), "hello?\n\u{0}\u{1}\n").unwrap();
    let out = analyze(&[
        "/no/such/trace.jsonl",
        junk.path().to_str().unwrap(),
        good.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/no/such/trace.jsonl: cannot open"), "{err}");
    assert!(err.contains("a trace starts with a hello line"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("200 samples"));
}

/// A trainer capped at 4.75 GiB (`set_per_process_memory_fraction`) on an 80 GB device, at 98%
/// of its cap, that then OOMs. The cap arrives in the hello, or only in a later sample: either
/// way the replay judges headroom and the OOM against it, as the daemon does live.
#[test]
fn a_capped_trace_is_judged_against_its_cap() {
    const MIB: u64 = 1 << 20;
    let cap = 4 * GIB + 768 * MIB;
    for cap_in_hello in [true, false] {
        let mut f = tempfile::Builder::new()
            .suffix(".jsonl")
            .tempfile()
            .unwrap();
        let hello_cap = if cap_in_hello {
            format!(",\"alloc_limit\":{cap}")
        } else {
            String::new()
        };
        writeln!(f, r#"{{"type":"hello","v":1,"job":"capped"{hello_cap}}}"#).unwrap();
        let reserved = cap / 100 * 98;
        for s in 1..=40u64 {
            let sample_cap = if !cap_in_hello && s == 5 {
                format!(",\"alloc_limit\":{cap}")
            } else {
                String::new()
            };
            writeln!(
                f,
                r#"{{"type":"sample","ts":{},"step":{s},"stats":{{"allocated_bytes.all.current":{},"allocated_bytes.all.peak":{},"reserved_bytes.all.current":{reserved}}},"device_free":{},"device_total":{TOTAL}{sample_cap}}}"#,
                1_763_700_000 + s,
                3 * GIB,
                reserved - 60 * MIB,
                74 * GIB,
            )
            .unwrap();
        }
        writeln!(
            f,
            r#"{{"type":"event","ts":1763700041,"kind":"oom","alloc_bytes":{},"device_free":{},"alloc_limit":{cap}}}"#,
            384 * MIB,
            74 * GIB
        )
        .unwrap();
        let out = analyze(&["--format", "json", f.path().to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let findings = v["traces"][0]["findings"].as_array().unwrap();
        let message = |kind: &str| {
            findings
                .iter()
                .find(|x| x["kind"] == kind)
                .unwrap_or_else(|| panic!("no {kind} in {findings:?}"))["message"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let near = message("near_limit");
        assert!(near.ends_with(" of the 4.75 GiB allowed"), "{near}");
        assert_eq!(
            message("oom"),
            "CUDA out of memory: tried to allocate 384.0 MiB with 4.65 GiB of the 4.75 GiB allowed already reserved at step 40"
        );
    }
}
