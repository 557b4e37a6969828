//! A trainer's text never drives the operator's terminal: `gpumon status` and `gpumon analyze`
//! print its control characters escaped (`\u{1b}`), while the JSON API and `--format json`
//! keep the true strings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::*;

const GIB: u64 = 1 << 30;
const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";
/// Clears the screen, retitles the window, and (C1 CSI, CR, LF) forges a line of its own.
const HOSTILE: &str = "evil\u{1b}[2J\u{1b}]0;pwned\u{7}\u{9b}2J\rFORGED\nFORGED";
const HOSTILE_SHOWN: &str = "evil\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\u{9b}2J\\u{d}FORGED\\u{a}FORGED";

/// What must never reach a terminal: the bytes a terminal obeys, found in `out`.
fn raw_controls(out: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(out);
    text.chars()
        .filter(|c| *c != '\n' && (c.is_control() || *c == '\u{202e}'))
        .map(|c| format!("U+{:04X}", c as u32))
        .collect()
}

fn status(url: &str) -> String {
    let out = Command::new(BIN)
        .args(["status", "--connect", url])
        .env_remove("GPUMON_LISTEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(raw_controls(&out.stdout), Vec::<String>::new());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn status_escapes_a_hostile_job_and_the_api_keeps_it() {
    let d = Daemon::with_scenario("two_gpus");
    let mut w = UnixStream::connect(&d.socket).unwrap();
    w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let hello = serde_json::json!({"type": "hello", "v": 1, "pid": 7, "job": HOSTILE,
        "rank": 0, "gpu_uuid": GPU0, "client": "test/1"});
    writeln!(w, "{hello}").unwrap();
    let mut welcome = String::new();
    BufReader::new(w.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    writeln!(
        w,
        r#"{{"type":"sample","ts":1763700000.0,"step":1,"stats":{{"allocated_bytes.all.current":{GIB},"reserved_bytes.all.current":{}}}}}"#,
        2 * GIB
    )
    .unwrap();
    d.wait_for(Duration::from_secs(10), "the session's first step", || {
        d.snapshot()["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["step"] == 1))
    });

    // The JSON API carries the true string.
    let snap = d.snapshot();
    assert_eq!(snap["sessions"][0]["job"], HOSTILE, "{snap}");

    let text = status(&d.url(""));
    // Cut to the JOB column's 20 characters, escaped before the cut.
    assert!(text.contains("evil\\u{1b}[2J\\u{1b}~"), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("FORGED")), "{text}");
    drop(w);
}

/// Serves `body` as the snapshot to every request, as a daemon would.
fn serve_snapshot(body: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}")
}

/// Process names, users and containers come from /proc and the kubelet, GPU names and errors
/// from the driver: every column of the table goes through the same rule.
#[test]
fn status_escapes_every_column_not_only_the_job() {
    let d = Daemon::with_scenario("two_gpus");
    let mut snap = d.snapshot();
    let procs = snap["processes"].as_array_mut().unwrap();
    assert!(!procs.is_empty(), "the scenario lists processes");
    for p in procs.iter_mut() {
        // ProcInfo is flattened into each process.
        p["name"] = HOSTILE.into();
        p["user"] = HOSTILE.into();
        p["container"] = HOSTILE.into();
    }
    snap["gpus"][0]["name"] = "H100\u{1b}]0;gpu\u{7}\u{202e}".into();
    snap["hostname"] = "node\u{1b}[31m".into();
    let text = status(&serve_snapshot(snap.to_string()));
    // Escaped first, then cut to the column.
    for shown in [
        "node\\u{1b}[31m",
        "H100\\u{1b}]0;gpu\\u{7}\\u{2~",
        "evil\\u{1b}[~ evil\\u{1b}[2J~ evil\\u{1b}[2J\\u~",
    ] {
        assert!(text.contains(shown), "{shown:?} missing:\n{text}");
    }
    assert!(!text.lines().any(|l| l.starts_with("FORGED")), "{text}");
}

/// A leak attributed to a hostile file and function, then an OOM whose explanation names them
/// too: what `gpumon analyze` replays from a recorded trace.
fn hostile_trace() -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    let hello = serde_json::json!({"type": "hello", "v": 1, "pid": 1, "job": HOSTILE,
        "rank": 0, "caps": ["attribution"]});
    writeln!(f, "{hello}").unwrap();
    let frame = serde_json::json!({"file": format!("/p/{HOSTILE}.py"), "line": 3,
        "function": HOSTILE});
    let total = 80 * GIB;
    for s in 0..4000u64 {
        let floor = 20 * GIB + s.saturating_sub(500) * (4 << 20) + (s * 7919 % 97) * (1 << 20);
        let reserved = floor + 11 * GIB;
        writeln!(
            f,
            r#"{{"type":"sample","ts":{},"step":{s},"stats":{{"allocated_bytes.all.current":{floor},"allocated_bytes.all.peak":{},"reserved_bytes.all.current":{reserved}}},"device_free":{},"device_total":{total}}}"#,
            1_763_700_000 + s,
            floor + 10 * GIB,
            total - reserved - GIB
        )
        .unwrap();
        // Within the window of the request the daemon makes when the leak is raised (step
        // 623): an answer the replay takes, as the daemon did.
        if s == 700 {
            let a = serde_json::json!({"type": "attribution", "id": 1,
                "ts": 1_763_700_000 + s, "step_from": 670, "step_to": 700, "seconds": 30.0,
                "total_growth_bytes": 125_829_120u64,
                "sites": [{"file": format!("/p/{HOSTILE}.py"), "line": 3, "function": HOSTILE,
                    "bytes": 125_829_120u64, "blocks": 120, "stack": [frame, frame],
                    "note": HOSTILE}]});
            writeln!(f, "{a}").unwrap();
        }
    }
    let mut x: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/oom/fragmentation.json")).unwrap();
    x["failing_site"]["file"] = format!("/p/{HOSTILE}.py").into();
    x["failing_site"]["function"] = HOSTILE.into();
    x["live_sites"][0]["function"] = HOSTILE.into();
    x["reasons"] = serde_json::json!([HOSTILE]);
    x["remedies"] = serde_json::json!([HOSTILE]);
    let oom = serde_json::json!({"type": "event", "ts": 1_763_704_000.5, "kind": "oom",
        "alloc_bytes": 1_610_612_736u64, "alloc_limit": 4u64 * GIB, "explanation": x});
    writeln!(f, "{oom}").unwrap();
    writeln!(f, r#"{{"type":"bye","ts":1763799999}}"#).unwrap();
    f
}

#[test]
fn analyze_prints_no_escape_and_its_json_keeps_the_true_strings() {
    let t = hostile_trace();
    let out = Command::new(BIN)
        .arg("analyze")
        .arg(t.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "findings were raised");
    let esc = out.stdout.iter().filter(|b| **b == 0x1b).count();
    let bel = out.stdout.iter().filter(|b| **b == 0x07).count();
    assert_eq!((esc, bel), (0, 0));
    assert_eq!(raw_controls(&out.stdout), Vec::<String>::new());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.lines().any(|l| l.starts_with("FORGED")), "{text}");
    // Each place a trainer's string is shown, shown escaped: job, site, stack, note, OOM.
    assert!(text.contains(&format!("job={HOSTILE_SHOWN}")), "{text}");
    assert!(text.contains("attribution:"), "{text}");
    assert!(text.contains("oom"), "{text}");
    assert!(
        text.matches(HOSTILE_SHOWN).count() >= 5,
        "fewer escaped strings than expected:\n{text}"
    );

    let (code, v) = analyze_json(t.path());
    assert_eq!(code, Some(1));
    let tr = &v["traces"][0];
    assert_eq!(tr["job"], HOSTILE);
    assert_eq!(tr["bad_line_count"], 0, "{tr}");
    let leak = tr["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "leak")
        .expect("a leak");
    assert_eq!(leak["attribution"]["sites"][0]["function"], HOSTILE);
    let oom = tr["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["explanation"].is_object())
        .expect("an explained oom");
    assert_eq!(oom["explanation"]["failing_site"]["function"], HOSTILE);
}
