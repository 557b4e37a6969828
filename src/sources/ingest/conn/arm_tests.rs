//! The arming cycle as the trainer sees it on its connection: the `arm` and `disarm` lines, and
//! what its `armed` and `peak` answers get back.

use super::*;
use crate::core::apply::Core;
use crate::core::store::sessions::{OomPolicy, SessionLimits, Sessions};
use crate::sources::ingest::drive::{line, request};

const PEER: Peer = Peer {
    pid: 5,
    uid: 1000,
    gid: 1000,
};
const HELLO: &[u8] =
    br#"{"type":"hello","v":1,"job":"j","alloc_limit":4294967296,"caps":["oom_history"]}"#;

/// A step a second under a 4 GiB cap, its peak `peak` bytes.
fn sample(step: u64, peak: u64) -> Vec<u8> {
    format!(
        r#"{{"type":"sample","ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":1073741824,"allocated_bytes.all.peak":{peak}}},"device_free":75161927680,"device_total":85899345920}}"#,
        1_763_700_000 + step
    )
    .into_bytes()
}

fn json(line: &[u8]) -> serde_json::Value {
    assert!(line.ends_with(b"\n"));
    serde_json::from_slice(line).unwrap()
}

/// Steps from `from` with the step peak `peak`, until a request comes due; it and the step.
fn until_request(c: &mut Conn, s: &mut Core, from: u64, peak: u64) -> (u64, serde_json::Value) {
    for step in from..from + 1000 {
        let now = 1_763_700_000.0 + step as f64;
        assert_eq!(line(c, &sample(step, peak), s, now), Outcome::Accepted);
        if let Some(line) = request(c, s, now) {
            return (step, json(&line));
        }
    }
    panic!("nothing asked");
}

fn reply(o: Outcome) -> (String, Option<Code>) {
    match o {
        Outcome::Reply { line, rejected } => (String::from_utf8(line).unwrap(), rejected),
        other => panic!("expected a reply, got {other:?}"),
    }
}

#[test]
fn a_trainer_near_its_limit_is_armed_answers_and_is_disarmed() {
    let mut s = Core::with_sessions(
        Sessions::new(SessionLimits::default()).with_arming(OomPolicy::default()),
    );
    let mut c = Conn::new(PEER);
    reply(line(&mut c, HELLO, &mut s, 1.0));
    let (step, arm) = until_request(&mut c, &mut s, 1, (4 << 30) - (10 << 20));
    assert_eq!(
        arm,
        serde_json::json!({"type":"arm","v":1,"id":1,"finding":"s-1/near_limit","seconds":900,
            "max_entries":20000,"peak_after_steps":20})
    );
    let (e, code) = reply(line(
        &mut c,
        br#"{"type":"armed","id":9,"ts":1763700010}"#,
        &mut s,
        2.0,
    ));
    assert_eq!(code, Some(Code::BadField));
    assert!(
        e.contains("armed with id 9 answers no open arm request"),
        "{e}"
    );
    assert_eq!(
        line(
            &mut c,
            br#"{"type":"armed","id":1,"ts":1763700010}"#,
            &mut s,
            2.0
        ),
        Outcome::Accepted
    );
    let peak = br#"{"type":"peak","id":1,"ts":1763700030,"step_from":10,"step_to":30,"peak_bytes":4294967296,"sites":[{"file":"/x/model.py","line":88,"function":"attention","bytes":2147483648,"blocks":48}]}"#;
    assert_eq!(line(&mut c, peak, &mut s, 3.0), Outcome::Accepted);
    let (e, code) = reply(line(&mut c, peak, &mut s, 3.0));
    assert_eq!(code, Some(Code::BadField));
    assert!(
        e.contains("peak with id 1 answers no open arm request"),
        "{e}"
    );
    let near = s
        .sessions()
        .live()
        .next()
        .unwrap()
        .detect
        .near_limit()
        .unwrap();
    assert!(
        near.message.contains("model.py:88 in attention"),
        "{}",
        near.message
    );
    // Room again: once near_limit resolves, the trainer is told to stop.
    let (_, disarm) = until_request(&mut c, &mut s, step + 1, 2 << 30);
    assert_eq!(disarm, serde_json::json!({"type":"disarm","v":1,"id":1}));
    assert!(s.sessions().live().next().unwrap().arming.armed().is_none());
}
