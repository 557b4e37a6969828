use super::*;
use crate::core::apply::Core;
use crate::core::store::sessions::{SessionLimits, Sessions};
use crate::core::trainer::{Ending, EventKind};
use crate::outputs::record::{Caps, Recorder};
use crate::sources::ingest::drive::{close, line, request};

const PEER: Peer = Peer {
    pid: 77,
    uid: 1000,
    gid: 1000,
};
const HELLO: &[u8] = br#"{"type":"hello","v":1,"pid":5,"job":"j","gpu_uuid":"GPU-1"}"#;
const SAMPLE: &[u8] =
    br#"{"type":"sample","ts":1763700000,"step":1,"stats":{"allocated_bytes.all.current":10}}"#;

fn reply_of(o: Outcome) -> (String, Option<Code>) {
    match o {
        Outcome::Reply { line, rejected } => (String::from_utf8(line).unwrap(), rejected),
        other => panic!("expected a reply, got {other:?}"),
    }
}

#[test]
fn hello_then_samples_then_bye() {
    let mut s = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut c = Conn::new(PEER);
    let (welcome, rej) = reply_of(line(&mut c, HELLO, &mut s, 1.0));
    assert_eq!(rej, None);
    assert!(welcome.contains(r#""type":"welcome""#) && welcome.contains(r#""session":"s-1""#));
    assert_eq!(line(&mut c, SAMPLE, &mut s, 2.0), Outcome::Accepted);
    let sess = s.sessions().live().next().unwrap();
    assert_eq!(sess.peer.pid, 77);
    assert_eq!(sess.hello.ns_pid, Some(5));
    assert_eq!(sess.samples, 1);
    assert_eq!(
        line(&mut c, br#"{"type":"bye"}"#, &mut s, 3.0),
        Outcome::Bye
    );
    close(c, &mut s, Closing::Crash, 4.0);
    assert_eq!(
        s.sessions().ended().next().unwrap().ended,
        Some((3.0, Ending::Clean))
    );
}

#[test]
fn sample_before_hello_and_second_hello_are_refused_but_the_connection_goes_on() {
    let mut s = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut c = Conn::new(PEER);
    let (e, code) = reply_of(line(&mut c, SAMPLE, &mut s, 1.0));
    assert_eq!(code, Some(Code::NoHello));
    assert!(e.contains(r#""line":1"#));
    reply_of(line(&mut c, HELLO, &mut s, 1.0));
    let (_, code) = reply_of(line(&mut c, HELLO, &mut s, 1.0));
    assert_eq!(code, Some(Code::DuplicateHello));
    let (e, code) = reply_of(line(&mut c, b"garbage", &mut s, 1.0));
    assert_eq!(code, Some(Code::BadJson));
    assert!(e.contains(r#""line":4"#));
    assert_eq!(line(&mut c, SAMPLE, &mut s, 2.0), Outcome::Accepted);
    assert_eq!(s.sessions().live_count(), 1);
}

#[test]
fn close_without_bye_is_a_crash() {
    let mut s = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut c = Conn::new(PEER);
    reply_of(line(&mut c, HELLO, &mut s, 1.0));
    close(c, &mut s, Closing::Crash, 9.0);
    let ended = s.sessions().ended().next().unwrap();
    assert_eq!(ended.ended, Some((9.0, Ending::Crash)));
    assert_eq!(ended.events.back().unwrap().kind, "crash");
}

/// A line of a trainer whose floor grows 4 MiB a step on a 16 GiB device.
#[test]
fn the_welcome_names_the_rate_limit_and_over_it_a_notice_goes_out_once_a_second() {
    let mut s = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let (plain, _) = reply_of(line(&mut Conn::new(PEER), HELLO, &mut s, 1.0));
    assert!(!plain.contains("max_lines_per_second"), "{plain}");
    let mut c = Conn::new(PEER).rate_limited(40);
    let (welcome, _) = reply_of(line(&mut c, HELLO, &mut s, 1.0));
    let w: serde_json::Value = serde_json::from_str(&welcome).unwrap();
    assert_eq!(w["type"], "welcome");
    assert_eq!(w["max_lines_per_second"], 40);
    let (first, code) = reply_of(c.over_limit(10.0).unwrap());
    assert_eq!(code, Some(Code::RateLimited));
    assert!(
        first.contains("40 lines/s") && first.contains("1 line(s) dropped"),
        "{first}"
    );
    assert!(first.contains(r#""line":2"#), "{first}");
    assert!(c.over_limit(10.5).is_none());
    assert!(c.over_limit(10.99).is_none());
    let (second, _) = reply_of(c.over_limit(11.0).unwrap());
    assert!(second.contains("3 line(s) dropped") && second.contains(r#""line":5"#));
    // A clock stepped back does not silence the notices.
    assert!(c.over_limit(3.0).is_some());
    // Dropped lines end nothing: the session is live, and its bye still ends it cleanly.
    assert_eq!(
        line(&mut c, br#"{"type":"bye"}"#, &mut s, 12.0),
        Outcome::Bye
    );
    assert_eq!(
        s.sessions().ended().last().unwrap().ended.map(|(_, e)| e),
        Some(Ending::Clean)
    );
}

fn leaking(step: u64) -> Vec<u8> {
    let floor = (2u64 << 30) + step * (4 << 20);
    format!(
        "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{floor}}},\"device_total\":{}}}",
        1_763_700_000.0 + step as f64 * 0.1,
        16u64 << 30
    )
    .into_bytes()
}

/// Runs a leaking trainer with `hello` until it is asked (or 2000 steps); the request.
fn asked(hello: &[u8], s: &mut Core, c: &mut Conn) -> Option<serde_json::Value> {
    reply_of(line(c, hello, s, 1.0));
    (1..2000).find_map(|step| {
        assert_eq!(line(c, &leaking(step), s, 2.0), Outcome::Accepted);
        let line = request(c, s, 1_763_700_000.0 + step as f64 * 0.1)?;
        assert!(line.ends_with(b"\n"));
        Some(serde_json::from_slice(&line).unwrap())
    })
}

#[test]
fn a_capable_trainer_is_asked_and_its_answer_lands_on_the_finding() {
    use crate::core::store::sessions::AttributionPolicy;
    let mut s = Core::with_sessions(
        Sessions::new(SessionLimits::default()).with_attribution(AttributionPolicy::default()),
    );
    let mut c = Conn::new(PEER);
    let hello = br#"{"type":"hello","v":1,"job":"j","caps":["attribution"]}"#;
    let req = asked(hello, &mut s, &mut c).expect("asked");
    assert_eq!(req["type"], "attribute");
    assert_eq!((req["v"].as_u64(), req["id"].as_u64()), (Some(1), Some(1)));
    assert_eq!(req["finding"], "s-1/leak");
    // A wrong id is an error reply; the right one is accepted.
    let answer = |id: u64| {
        format!(
            r#"{{"type":"attribution","id":{id},"ts":1763700100,"total_growth_bytes":100,"sites":[{{"file":"/x/train.py","line":27,"function":"kept_outputs","bytes":93,"blocks":1}}]}}"#
        )
    };
    let (e, code) = reply_of(line(&mut c, answer(2).as_bytes(), &mut s, 3.0));
    assert_eq!(code, Some(Code::BadField));
    assert!(e.contains("id 2 answers no open request"), "{e}");
    assert_eq!(
        line(&mut c, answer(1).as_bytes(), &mut s, 3.0),
        Outcome::Accepted
    );
    let leak = s.sessions().live().next().unwrap().detect.leak().unwrap();
    assert!(leak.message.contains("train.py:27"), "{}", leak.message);
    assert_eq!(
        request(&c, &mut s, 1e10),
        None,
        "answered: nothing more to ask"
    );
}

#[test]
fn a_trainer_without_the_capability_is_never_asked() {
    use crate::core::store::sessions::AttributionPolicy;
    let mut s = Core::with_sessions(
        Sessions::new(SessionLimits::default()).with_attribution(AttributionPolicy::default()),
    );
    let mut c = Conn::new(PEER);
    assert_eq!(asked(HELLO, &mut s, &mut c), None);
    assert!(
        s.sessions().live().next().unwrap().detect.leak().is_some(),
        "the leak was raised"
    );
    // And an attribution it sends anyway answers nothing.
    let (_, code) = reply_of(line(
        &mut c,
        br#"{"type":"attribution","id":1,"ts":1763700100,"sites":[]}"#,
        &mut s,
        3.0,
    ));
    assert_eq!(code, Some(Code::BadField));
}

fn numbered(seq: u64) -> Vec<u8> {
    format!(r#"{{"type":"sample","ts":1763700000,"step":{seq},"seq":{seq},"stats":{{"allocated_bytes.all.current":10}}}}"#).into_bytes()
}

const ACKING: &[u8] = br#"{"type":"hello","v":1,"job":"j","caps":["ack"],"instance":"c-1"}"#;

#[test]
fn acks_come_at_most_every_tenth_of_a_second_or_64_lines() {
    let mut s = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut c = Conn::new(PEER).acking(Arc::default());
    let (welcome, _) = reply_of(line(&mut c, ACKING, &mut s, 1.0));
    assert!(welcome.contains(r#""ack":true"#), "{welcome}");
    assert_eq!(c.ack_due(1.0), None, "nothing numbered yet");
    assert_eq!(line(&mut c, &numbered(1), &mut s, 1.0), Outcome::Accepted);
    assert_eq!(c.ack_due(1.0).unwrap(), b"{\"type\":\"ack\",\"seq\":1}\n");
    for seq in 2..=10 {
        line(&mut c, &numbered(seq), &mut s, 1.0);
    }
    assert_eq!(c.ack_due(1.05), None, "too soon, too few");
    assert_eq!(c.ack_due(1.11).unwrap(), b"{\"type\":\"ack\",\"seq\":10}\n");
    for seq in 11..=74 {
        line(&mut c, &numbered(seq), &mut s, 1.0);
    }
    assert_eq!(c.ack_due(1.12).unwrap(), b"{\"type\":\"ack\",\"seq\":74}\n");
    // Without the capability: no ack in the welcome, none sent, seq ignored.
    let mut plain = Conn::new(PEER).acking(Arc::default());
    let (welcome, _) = reply_of(line(&mut plain, HELLO, &mut s, 1.0));
    assert!(!welcome.contains("ack"), "{welcome}");
    assert_eq!(
        line(&mut plain, &numbered(1), &mut s, 1.0),
        Outcome::Accepted
    );
    assert_eq!(
        line(&mut plain, &numbered(1), &mut s, 1.0),
        Outcome::Accepted
    );
    assert_eq!(plain.ack_due(9.0), None);
}

#[test]
fn lines_resent_on_a_new_connection_are_dropped_once_applied() {
    let mut s = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let resume = Arc::new(Resume::default());
    let mut first = Conn::new(PEER).acking(resume.clone());
    reply_of(line(&mut first, ACKING, &mut s, 1.0));
    for seq in 1..=5 {
        line(&mut first, &numbered(seq), &mut s, 1.0);
    }
    // The new connection says hello before the old one is seen closing.
    let mut second = Conn::new(PEER).acking(resume.clone());
    reply_of(line(&mut second, ACKING, &mut s, 2.0));
    close(first, &mut s, Closing::Crash, 2.0);
    let outcomes: Vec<_> = (3..=7)
        .map(|seq| line(&mut second, &numbered(seq), &mut s, 2.0))
        .collect();
    assert_eq!(
        outcomes,
        [
            Outcome::Duplicate,
            Outcome::Duplicate,
            Outcome::Duplicate,
            Outcome::Accepted,
            Outcome::Accepted
        ]
    );
    let samples: u64 = s
        .sessions()
        .live()
        .chain(s.sessions().ended())
        .map(|x| x.samples)
        .sum();
    assert_eq!(samples, 7, "each line applied once");
    // Resends are acknowledged too, so the client forgets them.
    assert_eq!(
        second.ack_due(3.0).unwrap(),
        b"{\"type\":\"ack\",\"seq\":7}\n"
    );
    // Another user cannot silence this client by borrowing its instance name.
    let other = Peer { uid: 1001, ..PEER };
    let mut third = Conn::new(other).acking(resume);
    reply_of(line(&mut third, ACKING, &mut s, 3.0));
    assert_eq!(
        line(&mut third, &numbered(2), &mut s, 3.0),
        Outcome::Accepted
    );
}

#[test]
fn a_recorded_session_is_acknowledged_only_as_far_as_its_trace_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let stats = std::sync::Arc::new(crate::outputs::record::RecordStats::new());
    let rec = Recorder::new(dir.path(), Caps::bytes(1 << 30, 1 << 30), stats).unwrap();
    let mut s = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut c = Conn::new(PEER)
        .acking(Arc::default())
        .recording(Some(rec.clone() as Arc<dyn Tap>));
    reply_of(line(&mut c, ACKING, &mut s, 1.0));
    line(&mut c, &numbered(1), &mut s, 1.0);
    assert_eq!(
        c.ack_due(5.0),
        None,
        "line 1 is still in the trace's buffer"
    );
    // 64 KiB of lines send the buffer to the recorder thread, which writes it.
    let mut seq = 1;
    while c.trace.as_ref().unwrap().durable() == 0 && seq < 100_000 {
        seq += 1;
        line(&mut c, &numbered(seq), &mut s, 1.0);
        if seq % 1000 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let durable = c.trace.as_ref().unwrap().durable();
    assert!(durable > 1 && durable <= seq, "{durable} of {seq}");
    let ack: serde_json::Value = serde_json::from_slice(&c.ack_due(6.0).unwrap()).unwrap();
    assert_eq!(ack["seq"], durable);
    drop(c);
    rec.finish();
    let text: String = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .collect();
    assert!(text.contains(&format!(r#""seq":{durable},"#)));
}

#[test]
fn an_idle_close_is_written_to_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let stats = std::sync::Arc::new(crate::outputs::record::RecordStats::new());
    let rec = Recorder::new(dir.path(), Caps::bytes(1 << 30, 1 << 30), stats).unwrap();
    let mut s = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut c = Conn::new(PEER).recording(Some(rec.clone() as Arc<dyn Tap>));
    reply_of(line(&mut c, HELLO, &mut s, 1.0));
    line(&mut c, SAMPLE, &mut s, 1.0);
    close(
        c,
        &mut s,
        Closing::Idle("nothing sent for 900 s".into()),
        901.0,
    );
    rec.finish();
    let text: String = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .collect();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["kind"], EventKind::IdleTimeout.as_str(), "{text}");
    assert_eq!(last["detail"], "nothing sent for 900 s");
    assert_eq!(
        s.sessions().ended().next().unwrap().ended,
        Some((901.0, Ending::Clean))
    );
}
