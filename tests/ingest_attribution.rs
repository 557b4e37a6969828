//! Leak attribution through the real daemon over its real Unix socket: a trainer that announced
//! the capability is asked when its leak is raised, its answer lands on the finding (and in the
//! recorded trace, which `gpumon analyze` replays to the same attributed finding); a trainer
//! without it is never asked; a bad answer is refused and changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";
/// Steps sent: the leak detector's warm-up is 256 steps; a 4 MiB/step leak is raised soon after.
const STEPS: u64 = 600;

struct Trainer {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Trainer {
    fn connect(d: &Daemon, caps: bool) -> Self {
        let w = UnixStream::connect(&d.socket).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let r = BufReader::new(w.try_clone().unwrap());
        let mut t = Self { w, r };
        t.send(&hello(caps));
        assert_eq!(t.read()["type"], "welcome");
        t
    }

    fn send(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).unwrap();
        self.w.write_all(b"\n").unwrap();
    }

    fn read(&mut self) -> serde_json::Value {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// A leaking run: the floor grows 4 MiB a step on a 16 GiB device. Sent in pieces, as a
    /// trainer sends them, so the daemon applies them in many batches.
    fn leak(&mut self, steps: std::ops::RangeInclusive<u64>) {
        for step in steps {
            self.send(&sample_line(step));
            if step % 50 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn hello(caps: bool) -> String {
    let caps = if caps {
        r#","caps":["attribution"]"#
    } else {
        ""
    };
    format!(
        r#"{{"type":"hello","v":1,"pid":7,"job":"ft","rank":0,"gpu_uuid":"{GPU0}","client":"test/1","torch":"2.5.1"{caps}}}"#
    )
}

fn sample_line(step: u64) -> String {
    let floor = 2 * GIB + step * 4 * MIB;
    format!(
        r#"{{"type":"sample","ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":{floor},"allocated_bytes.all.peak":{},"reserved_bytes.all.current":{}}},"device_free":{},"device_total":{}}}"#,
        1_763_700_000.0 + step as f64 * 0.1,
        floor + GIB,
        floor + GIB,
        16 * GIB - floor - GIB,
        16 * GIB
    )
}

/// The answer a trainer sends: 93 of 100 MiB grown at train.py:27.
fn answer(id: u64) -> String {
    format!(
        r#"{{"type":"attribution","id":{id},"ts":1763700070.0,"step_from":400,"step_to":420,"seconds":2.0,"total_growth_bytes":104857600,"sites":[{{"file":"/home/alice/proj/train.py","line":27,"function":"kept_outputs","bytes":97517568,"blocks":20,"stack":[{{"file":"/home/alice/proj/train.py","line":27,"function":"kept_outputs"}},{{"file":"/home/alice/proj/train.py","line":48,"function":"run"}}]}}]}}"#
    )
}

fn leak_finding(d: &Daemon) -> Option<serde_json::Value> {
    d.snapshot()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "leak")
        .cloned()
}

fn session_events(d: &Daemon, kind: &str) -> Vec<String> {
    d.snapshot()["sessions"][0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .map(|e| e["detail"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn a_capable_trainer_is_asked_and_its_answer_names_the_site_on_the_finding() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&scenario("two_gpus")),
        args: DaemonOpts::default_args_and(vec![
            "--record-dir".into(),
            dir.path().to_str().unwrap().into(),
        ]),
        ..DaemonOpts::default()
    });
    let mut t = Trainer::connect(&d, true);
    t.leak(1..=STEPS);
    // Nothing else is sent back to a well-behaved trainer: the next line is the request.
    let req = t.read();
    assert_eq!(req["type"], "attribute", "{req}");
    assert_eq!(req["v"], 1);
    assert_eq!(req["id"], 1);
    assert_eq!(
        common::plain_id(req["finding"].as_str().unwrap()),
        "s-1/leak"
    );
    // 32 MiB at 4 MiB/step: the least window, 20 steps; the configured defaults for the rest.
    assert_eq!(
        (
            &req["steps"],
            &req["seconds"],
            &req["max_entries"],
            &req["top"]
        ),
        (&20.into(), &120.into(), &4000.into(), &10.into())
    );
    assert_eq!(
        sample(&d.metrics(), "gpumon_ingest_requests_total"),
        Some(1.0)
    );
    let before = leak_finding(&d).expect("the leak finding is up");
    assert!(before.get("attribution").is_none(), "{before}");
    assert!(!before["message"].as_str().unwrap().contains("train.py"));

    t.send(&answer(1));
    d.wait_for(Duration::from_secs(5), "attribution on the finding", || {
        leak_finding(&d).is_some_and(|f| f.get("attribution").is_some())
    });
    let f = leak_finding(&d).unwrap();
    let site = &f["attribution"]["sites"][0];
    assert_eq!(site["file"], "/home/alice/proj/train.py");
    assert_eq!(site["line"], 27);
    assert_eq!(site["stack"].as_array().unwrap().len(), 2);
    assert_eq!(f["attribution"]["finding"], req["finding"]);
    let message = f["message"].as_str().unwrap();
    assert!(
        message.contains("train.py:27") && message.contains("kept_outputs"),
        "{message}"
    );
    assert_eq!(
        session_events(&d, "attribution"),
        ["93% at train.py:27 in kept_outputs"]
    );
    let asked = session_events(&d, "attribution_requested");
    assert_eq!(asked.len(), 1, "{asked:?}");

    // More steps refresh the finding; it keeps its site and nothing more is asked.
    t.leak(STEPS + 1..=STEPS + 100);
    t.send("{oops");
    assert_eq!(t.read()["code"], "bad_json", "no second request came first");
    assert!(leak_finding(&d).unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("train.py:27"));
    t.send(r#"{"type":"bye","ts":1763700100}"#);
    t.w.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = String::new();
    while t.r.read_line(&mut rest).unwrap() > 0 {}
    assert_eq!(d.stop().code(), Some(0));

    // The recorded trace keeps the answer; replayed, the leak carries it again.
    let trace = only_trace(dir.path());
    let text = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(
        text.lines()
            .filter(|l| l.contains(r#""type":"attribution""#))
            .count(),
        1
    );
    let found = analyze_leak(&trace);
    assert_eq!(
        found["attribution"]["sites"][0]["file"],
        "/home/alice/proj/train.py"
    );
    assert_eq!(found["attribution"]["sites"][0]["line"], 27);
}

#[test]
fn a_trainer_without_the_capability_is_never_asked() {
    let d = Daemon::with_scenario("two_gpus");
    let mut t = Trainer::connect(&d, false);
    t.leak(1..=STEPS);
    d.wait_for(Duration::from_secs(10), "the leak finding", || {
        leak_finding(&d).is_some_and(|f| f["state"] == "firing")
    });
    t.leak(STEPS + 1..=STEPS + 200);
    // Everything before this line was answered first: had a request been sent, it would be here.
    t.send("{oops");
    assert_eq!(t.read()["code"], "bad_json");
    assert!(session_events(&d, "attribution_requested").is_empty());
    // An answer nobody asked for is refused.
    t.send(&answer(1));
    let err = t.read();
    assert_eq!(err["code"], "bad_field");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("answers no open request"),
        "{err}"
    );
    let leak = leak_finding(&d).unwrap();
    assert!(leak.get("attribution").is_none());
    let message = leak["message"].as_str().unwrap();
    assert!(
        says_before_forecast(message, "; no line is named: the trainer's client does not record allocation history (its hello announced no `attribution`)"),
        "{message}"
    );
}

#[test]
fn a_malformed_answer_is_refused_and_changes_nothing() {
    let d = Daemon::with_scenario("two_gpus");
    let mut t = Trainer::connect(&d, true);
    t.leak(1..=STEPS);
    let req = t.read();
    assert_eq!(req["type"], "attribute");
    let before = leak_finding(&d).unwrap();
    let good = answer(1);
    let too_many_sites = {
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        let site = v["sites"][0].clone();
        v["sites"] = serde_json::Value::Array(vec![site; 21]);
        v.to_string()
    };
    let long_file = good.replace("/home/alice/proj/train.py", &"d/".repeat(300));
    for (bad, needle) in [
        (
            good.replace("\"line\":27", "\"line\":\"27\""),
            "sites[0].line",
        ),
        (
            good.replace("\"bytes\":97517568", "\"bytes\":-1"),
            "sites[0].bytes",
        ),
        (too_many_sites, "at most 20"),
        (long_file, "sites[0].file is 600 bytes"),
        (
            good.replace("\"id\":1", "\"id\":99"),
            "id 99 answers no open request",
        ),
    ] {
        t.send(&bad);
        let err = t.read();
        assert_eq!(err["code"], "bad_field", "{err}");
        assert!(err["message"].as_str().unwrap().contains(needle), "{err}");
    }
    let after = leak_finding(&d).unwrap();
    assert!(after.get("attribution").is_none(), "{after}");
    assert_eq!(after["message"], before["message"]);
    assert!(session_events(&d, "attribution").is_empty());
    assert!(session_events(&d, "attribution_failed").is_empty());
    // The window is still open for the real answer.
    t.send(&good);
    d.wait_for(Duration::from_secs(5), "the real answer attached", || {
        leak_finding(&d).is_some_and(|f| f.get("attribution").is_some())
    });
    let m = d.metrics();
    assert_eq!(
        sample(&m, r#"gpumon_ingest_rejected_total{code="bad_field"}"#),
        Some(5.0)
    );
}

#[test]
fn a_trainer_that_cannot_attribute_leaves_the_finding_and_says_why() {
    let d = Daemon::with_scenario("two_gpus");
    let mut t = Trainer::connect(&d, true);
    t.leak(1..=STEPS);
    assert_eq!(t.read()["type"], "attribute");
    t.send(r#"{"type":"attribution","id":1,"ts":1763700070,"error":"unavailable","detail":"torch.cuda is not available"}"#);
    d.wait_for(Duration::from_secs(5), "the failure event", || {
        !session_events(&d, "attribution_failed").is_empty()
    });
    assert_eq!(
        session_events(&d, "attribution_failed"),
        ["unavailable: torch.cuda is not available"]
    );
    let leak = leak_finding(&d).unwrap();
    assert!(leak.get("attribution").is_none());
    // The message itself says why no line is named: status, alerts and the webhook show it.
    let message = leak["message"].as_str().unwrap();
    assert!(
        says_before_forecast(message, "; no line is named: the trainer cannot record allocation history (torch.cuda is not available)"),
        "{message}"
    );
}

/// `message` has `clause`, before its forecast when it has one (a cut keeps the last clause,
/// and the time left matters more).
fn says_before_forecast(message: &str, clause: &str) -> bool {
    match (message.find(clause), message.find("; at this rate ")) {
        (Some(at), Some(forecast)) => at < forecast,
        (Some(at), None) => message.ends_with(clause) && at > 0,
        (None, _) => false,
    }
}

/// The one trace file the recorder wrote in `dir` (beside its own note file).
fn only_trace(dir: &Path) -> std::path::PathBuf {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".trace.jsonl"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// The leak finding `gpumon analyze --format json` reports for `trace`.
fn analyze_leak(trace: &Path) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["analyze", "--format", "json"])
        .arg(trace)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["traces"][0]["bad_line_count"], 0, "{report}");
    report["traces"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "leak")
        .cloned()
        .unwrap_or_else(|| panic!("no leak in {report}"))
}

#[test]
fn analyze_replays_a_written_trace_to_the_attributed_leak() {
    // A trace as the recorder writes it: hello, samples, the answer once the leak was up, bye.
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    writeln!(f, "{}", hello(true)).unwrap();
    for step in 1..=STEPS {
        writeln!(f, "{}", sample_line(step)).unwrap();
        if step == 450 {
            writeln!(f, "{}", answer(1)).unwrap();
        }
    }
    writeln!(f, r#"{{"type":"bye","ts":1763700100}}"#).unwrap();
    f.flush().unwrap();
    let leak = analyze_leak(f.path());
    assert!(leak["first_step"].as_u64().unwrap() < 450, "{leak}");
    assert_eq!(leak["attribution"]["sites"][0]["line"], 27);
    assert_eq!(leak["attribution"]["finding"], "s-1/leak");
}
