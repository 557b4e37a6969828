//! Arming before an OOM through the real daemon over its real Unix socket: a trainer that
//! announced `oom_history` and runs near its allocator cap is sent `arm`, answers `armed`, sends
//! what was live at the step peak, and the near_limit finding in the API carries that peak and
//! names its top site; once the pressure is gone the trainer gets `disarm`. The recorded trace,
//! replayed by `gpumon analyze`, puts the peak on the same finding.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";
const CAP: u64 = 4 * GIB;

struct Trainer {
    w: UnixStream,
    r: BufReader<UnixStream>,
    /// Samples are a second apart from here, recent enough that the daemon keeps their times.
    base: u64,
}

impl Trainer {
    fn connect(d: &Daemon) -> Self {
        let w = UnixStream::connect(&d.socket).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let r = BufReader::new(w.try_clone().unwrap());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let mut t = Self {
            w,
            r,
            base: now - 3000,
        };
        t.send(&format!(
            r#"{{"type":"hello","v":1,"pid":7,"job":"ft","rank":0,"gpu_uuid":"{GPU0}","client":"test/1","torch":"2.5.1","alloc_limit":{CAP},"caps":["oom_history"]}}"#
        ));
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

    fn ts(&self, step: u64) -> u64 {
        self.base + step
    }

    /// Steps a second apart with the step peak at `peak` bytes under the 4 GiB cap.
    fn steps(&mut self, steps: std::ops::RangeInclusive<u64>, peak: u64) {
        for step in steps {
            let line = format!(
                r#"{{"type":"sample","ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":{GIB},"allocated_bytes.all.peak":{peak},"reserved_bytes.all.current":{peak}}},"device_free":{},"device_total":{}}}"#,
                self.ts(step),
                70 * GIB,
                80 * GIB
            );
            self.send(&line);
            if step % 20 == 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn near_limit(d: &Daemon) -> Option<serde_json::Value> {
    d.snapshot()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "near_limit" && f["state"] == "firing")
        .cloned()
}

fn armed(d: &Daemon, session: &str) -> serde_json::Value {
    let (code, body) = d.get(&format!("/api/v1/sessions/{session}"));
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["armed"].clone()
}

#[test]
fn an_armed_trainer_near_its_limit_names_the_step_peak_and_is_disarmed() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&scenario("two_gpus")),
        args: DaemonOpts::default_args_and(vec![
            "--record-dir".into(),
            dir.path().to_str().unwrap().into(),
        ]),
        ..DaemonOpts::default()
    });
    let mut t = Trainer::connect(&d);
    // The peak 10 MiB under the cap: near_limit fires within a few steps.
    t.steps(1..=20, CAP - 10 * MIB);
    // Nothing else is sent back to a well-behaved trainer: the next line is the request.
    let arm = t.read();
    assert_eq!(arm["type"], "arm", "{arm}");
    assert_eq!((&arm["v"], &arm["id"]), (&1.into(), &1.into()));
    assert_eq!(plain_id(arm["finding"].as_str().unwrap()), "s-1/near_limit");
    assert_eq!(
        (
            &arm["seconds"],
            &arm["max_entries"],
            &arm["peak_after_steps"]
        ),
        (&900.into(), &20000.into(), &20.into())
    );
    let session = near_limit(&d).unwrap()["session"]
        .as_str()
        .unwrap()
        .to_string();
    let a = armed(&d, &session);
    assert_eq!(
        (&a["id"], &a["reason"], &a["recording"]),
        (&1.into(), &"near_limit".into(), &false.into()),
        "{a}"
    );
    assert_eq!(sample(&d.metrics(), "gpumon_oom_armed_sessions"), Some(1.0));

    t.send(&format!(r#"{{"type":"armed","id":1,"ts":{}}}"#, t.ts(20)));
    t.steps(21..=40, CAP - 10 * MIB);
    t.send(&format!(
        r#"{{"type":"peak","id":1,"ts":{},"step_from":21,"step_to":40,"peak_bytes":{},"sites":[{{"file":"/home/alice/proj/model.py","line":88,"function":"attention","bytes":{},"blocks":48,"stack":[{{"file":"/home/alice/proj/model.py","line":88,"function":"attention"}},{{"file":"/home/alice/proj/train.py","line":40,"function":"step"}}]}},{{"file":"/home/alice/proj/model.py","line":61,"function":"mlp","bytes":{},"blocks":12}}]}}"#,
        t.ts(40),
        CAP - 10 * MIB,
        2 * GIB,
        GIB
    ));
    d.wait_for(Duration::from_secs(5), "the peak on near_limit", || {
        near_limit(&d).is_some_and(|f| f.get("peak").is_some())
    });
    let f = near_limit(&d).unwrap();
    assert_eq!(f["peak"]["finding"], arm["finding"]);
    assert_eq!(f["peak"]["sites"][0]["line"], 88);
    assert_eq!(f["peak"]["sites"][0]["stack"][1]["function"], "step");
    let message = f["message"].as_str().unwrap();
    assert!(
        message.ends_with("; at the step peak 50% of live memory (2.0 GiB) was allocated at model.py:88 in attention"),
        "{message}"
    );
    assert_eq!(armed(&d, &session)["recording"], true);
    // A second peak for the same arming answers nothing.
    t.send(&format!(
        r#"{{"type":"peak","id":1,"ts":{},"sites":[]}}"#,
        t.ts(40)
    ));
    let err = t.read();
    assert_eq!(err["code"], "bad_field", "{err}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("answers no open arm request"),
        "{err}"
    );

    // Room again: near_limit resolves after its quiet period and the trainer is disarmed.
    t.steps(41..=200, 2 * GIB);
    let disarm = t.read();
    assert_eq!(disarm, serde_json::json!({"type":"disarm","v":1,"id":1}));
    assert!(armed(&d, &session).is_null());
    assert_eq!(sample(&d.metrics(), "gpumon_oom_armed_sessions"), Some(0.0));
    assert!(near_limit(&d).is_none());

    t.send(&format!(r#"{{"type":"bye","ts":{}}}"#, t.ts(200)));
    t.w.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = String::new();
    while t.r.read_line(&mut rest).unwrap() > 0 {}
    assert_eq!(d.stop().code(), Some(0));

    // The recorded trace keeps the answers; replayed, the near_limit finding carries the peak.
    let (_, report) = analyze_json(&recorded_trace(dir.path()));
    let found = report["traces"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "near_limit")
        .cloned()
        .unwrap_or_else(|| panic!("no near_limit in {report}"));
    assert_eq!(found["peak"]["sites"][0]["function"], "attention");
    assert!(
        found["message"]
            .as_str()
            .unwrap()
            .contains("model.py:88 in attention"),
        "{found}"
    );
}
