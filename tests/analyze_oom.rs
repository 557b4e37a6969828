//! `gpumon analyze` on a trace with an explained OOM the trainer went on from: the text names the
//! pattern, the line that asked, what was live and the remedy, with trainer text escaped; the
//! JSON carries the explanation whole.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");
const GIB: u64 = 1 << 30;
const FRAGMENTATION: &str = include_str!("fixtures/oom/fragmentation.json");

/// hello, samples to step 220, the real fragmentation OOM (its top live site's function carrying
/// a terminal escape), and samples after it: the run went on.
fn trace() -> tempfile::NamedTempFile {
    let mut x: serde_json::Value = serde_json::from_str(FRAGMENTATION).unwrap();
    x["live_sites"][0]["function"] = "dev_pin\u{1b}]0;pwned\u{7}".into();
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    writeln!(
        f,
        r#"{{"type":"hello","v":1,"pid":1,"job":"bs-search","rank":0}}"#
    )
    .unwrap();
    let sample = |f: &mut tempfile::NamedTempFile, step: u64| {
        writeln!(
            f,
            r#"{{"type":"sample","ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":{},"reserved_bytes.all.current":{}}},"device_free":{},"device_total":{},"alloc_limit":{}}}"#,
            1_763_700_000 + step,
            GIB,
            3 * GIB,
            70 * GIB,
            80 * GIB,
            4 * GIB
        )
        .unwrap();
    };
    for step in 200..=220 {
        sample(&mut f, step);
    }
    let oom = serde_json::json!({"type": "event", "ts": 1_763_700_220.5, "kind": "oom",
        "alloc_bytes": 1_610_612_736u64, "alloc_limit": 4u64 * GIB, "explanation": x});
    writeln!(f, "{oom}").unwrap();
    for step in 221..=230 {
        sample(&mut f, step);
    }
    writeln!(f, r#"{{"type":"bye","ts":1763700300}}"#).unwrap();
    f
}

#[test]
fn an_explained_oom_is_reported_with_its_lines_escaped_and_whole_in_json() {
    let t = trace();
    let out = Command::new(BIN)
        .args(["analyze", t.path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "CUDA out of memory (fragmentation): tried to allocate 1.5 GiB at oomlib.py:37",
        "95% of live memory was allocated at oomlib.py:32",
        "; the run went on (step 221)",
        "explanation: fragmentation",
        "failed at /home/alice/proj/oomlib.py:37 in dev_big",
        "called from /home/alice/proj/snap_oom.py:71 in fragmentation",
        "live at the OOM:",
        "/home/alice/proj/oomlib.py:32 in dev_pin\\u{1b}]0;pwned\\u{7}",
        "remedy: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "hint: the cache held enough free memory but no block large enough",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text}"
    );

    let out = Command::new(BIN)
        .args(["analyze", "--format", "json", t.path().to_str().unwrap()])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let oom = v["traces"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "oom")
        .unwrap()
        .clone();
    assert_eq!(oom["explanation"]["pattern"], "fragmentation");
    assert_eq!(oom["explanation"]["failing_site"]["line"], 37);
    // Kept verbatim, the escape included: JSON escapes it itself.
    assert_eq!(
        oom["explanation"]["live_sites"][0]["function"],
        "dev_pin\u{1b}]0;pwned\u{7}"
    );
    assert_eq!(oom["evidence"]["survived"], true);
    assert_eq!(oom["evidence"]["explanation"], oom["explanation"]);
}
