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

const TRAIN_PY: &str = "/home/alice/proj/train.py";

/// A trainer that announced `attribution`, whose floor grows 4 MiB a step from step 500, and
/// that answers once, after step 700, with `answer` (the rest of an `attribution` line): within
/// the window the daemon's default policy gave the request it made when the leak was raised
/// (step 623), so the answer is taken, as it was live.
fn attributed_trace(answer: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    writeln!(
        f,
        r#"{{"type":"hello","v":1,"pid":1,"job":"ft","rank":0,"caps":["attribution"]}}"#
    )
    .unwrap();
    for s in 0..4000u64 {
        let floor = 20 * GIB + s.saturating_sub(500) * (4 << 20) + (s * 7919 % 97) * (1 << 20);
        let (peak, reserved) = (floor + 10 * GIB, floor + 11 * GIB);
        writeln!(
            f,
            r#"{{"type":"sample","ts":{},"step":{s},"stats":{{"allocated_bytes.all.current":{floor},"allocated_bytes.all.peak":{peak},"reserved_bytes.all.current":{reserved}}},"device_free":{},"device_total":{TOTAL}}}"#,
            1_763_700_000 + s,
            TOTAL - reserved - GIB
        )
        .unwrap();
        if s == 700 {
            writeln!(
                f,
                r#"{{"type":"attribution","id":1,"ts":{},{answer}}}"#,
                1_763_700_000 + s
            )
            .unwrap();
        }
    }
    writeln!(f, r#"{{"type":"bye","ts":1763799999}}"#).unwrap();
    f
}

/// What the trainer of the kept-outputs snapshot pair reports (the sites of its real diff:
/// 120 MiB in 120 blocks at train.py:27), over the 30 of these 4 MiB steps before it answers.
fn kept_outputs_answer() -> String {
    let frame = |line: u64, function: &str| {
        format!(r#"{{"file":"{TRAIN_PY}","line":{line},"function":"{function}"}}"#)
    };
    format!(
        r#""step_from":670,"step_to":700,"seconds":30.0,"total_growth_bytes":125829120,"sites":[{{"file":"{TRAIN_PY}","line":27,"function":"kept_outputs","bytes":125829120,"blocks":120,"stack":[{},{},{}]}}]"#,
        frame(27, "kept_outputs"),
        frame(48, "run"),
        frame(69, "<module>")
    )
}

#[test]
fn a_replayed_attribution_is_reported_under_its_leak() {
    let t = attributed_trace(&kept_outputs_answer());
    let path = t.path().to_str().unwrap();

    let out = analyze(&["--format", "json", path]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tr = &v["traces"][0];
    assert_eq!(
        tr["bad_line_count"], 0,
        "the attribution line is accepted: {tr}"
    );
    let leak = &tr["findings"][0];
    assert_eq!(leak["kind"], "leak");
    let a = &leak["attribution"];
    assert_eq!(
        (a["step_from"].as_u64(), a["step_to"].as_u64()),
        (Some(670), Some(700)),
        "{leak}"
    );
    assert_eq!(a["total_growth_bytes"], 125_829_120);
    let site = &a["sites"][0];
    assert_eq!(site["file"], TRAIN_PY);
    assert_eq!(site["line"], 27);
    assert_eq!(site["function"], "kept_outputs");
    assert_eq!(site["bytes"], 125_829_120);
    assert_eq!(site["blocks"], 120);
    let stack: Vec<String> = site["stack"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{}:{}", f["function"].as_str().unwrap(), f["line"]))
        .collect();
    assert_eq!(stack, ["kept_outputs:27", "run:48", "<module>:69"]);

    let out = analyze(&[path]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "attribution: 120.0 MiB of live memory grew in steps 670\u{2013}700, allocated at",
        "100%  120.0 MiB    120 blocks  /home/alice/proj/train.py:27 in kept_outputs",
        "called from /home/alice/proj/train.py:48 in run",
        "called from /home/alice/proj/train.py:69 in <module>",
    ] {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }
    // Under the leak, after its message and hint.
    let leak_at = text.find("  leak ").unwrap();
    assert!(text.find("attribution:").unwrap() > leak_at, "{text}");
}

#[test]
fn a_replayed_error_answer_says_why_there_are_no_sites() {
    let t = attributed_trace(
        r#""total_growth_bytes":0,"error":"unavailable","detail":"torch.cuda is not available""#,
    );
    let out = analyze(&[t.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    // The leak's own message says why no line is named, as it does live (the live finding
    // carries no attribution, so none is listed under it).
    assert!(
        text.contains("; no line is named: the trainer cannot record allocation history (torch.cuda is not available); at this rate"),
        "{text}"
    );
    assert!(!text.contains("bad line"), "{text}");
}

/// A healthy trace of `steps` samples that ends without bye, followed by `tail` as written.
fn cut_trace(steps: u64, tail: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    writeln!(f, r#"{{"type":"hello","v":1,"pid":1,"job":"ft"}}"#).unwrap();
    for s in 0..steps {
        writeln!(
            f,
            r#"{{"type":"sample","ts":{},"step":{s},"stats":{{"allocated_bytes.all.current":{}}}}}"#,
            1_763_700_000 + s,
            20 * GIB
        )
        .unwrap();
    }
    f.write_all(tail.as_bytes()).unwrap();
    f
}

#[test]
fn a_truncated_trace_says_so_instead_of_reporting_a_crash() {
    let json = |t: &tempfile::NamedTempFile| {
        let out = analyze(&["--format", "json", t.path().to_str().unwrap()]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v["traces"][0].clone())
    };
    // Without bye and without a sign of truncation, the trainer died: a crash.
    let (code, t) = json(&cut_trace(50, ""));
    assert_eq!(code, Some(1));
    assert_eq!(t["findings"][0]["kind"], "crash", "{t}");
    assert!(t.get("truncated").is_none());
    // The recorder stopped the trace (a full disk): its closing line says why, no crash.
    let marked = cut_trace(
        50,
        "{\"type\":\"trace_truncated\",\"reason\":\"disk_full\",\"ts\":1763700050}\n",
    );
    let (code, t) = json(&marked);
    assert_eq!(code, Some(0), "{t}");
    assert_eq!(t["truncated"], "recording stopped: disk_full");
    assert_eq!(t["bad_line_count"], 0);
    let text = analyze(&[marked.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("truncated: recording stopped: disk_full"),
        "{text}"
    );
    // Written up to the middle of a line: the same.
    let (code, t) = json(&cut_trace(50, "{\"type\":\"sample\",\"ts\":17637"));
    assert_eq!(code, Some(0), "{t}");
    assert_eq!(t["truncated"], "the trace ends mid-line");
    // Closed by the daemon for going quiet (its idle_timeout event is the last line): the
    // trainer may be alive, and no crash is read into it.
    let idle = cut_trace(
        50,
        "{\"type\":\"event\",\"ts\":1763700950,\"kind\":\"idle_timeout\",\"detail\":\"nothing sent for 900 s\"}\n",
    );
    let (code, t) = json(&idle);
    assert_eq!(code, Some(0), "{t}");
    assert_eq!(t["findings"].as_array().map(Vec::len), Some(0), "{t}");
}

#[test]
fn a_bad_line_is_numbered_as_in_the_file_past_recorder_and_blank_lines() {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    writeln!(f, r#"{{"type":"hello","v":1,"pid":1,"job":"ft","rank":0}}"#).unwrap();
    writeln!(
        f,
        r#"{{"type":"trace_gpu","gpu":"3","gpu_uuid":"GPU-x","ts":1763700000.000}}"#
    )
    .unwrap();
    writeln!(f).unwrap();
    writeln!(f, "{{not json").unwrap();
    writeln!(f, r#"{{"type":"bye","ts":1763700001}}"#).unwrap();
    let out = analyze(&["--format", "json", f.path().to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &v["traces"][0];
    assert_eq!(t["gpu"], "3", "{t}");
    let bad = t["bad_lines"][0].as_str().unwrap();
    assert!(bad.starts_with("line 4: "), "{bad}");
}
