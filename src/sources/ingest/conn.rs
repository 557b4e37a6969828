//! One connection's protocol state: hello first and once, then samples, events and attributions,
//! then bye; and the requests due to the trainer. Pure logic over the session store, so every
//! rule is unit-tested without sockets.

use std::sync::Arc;

use super::protocol::{self, Code, Message, Rejection, Reply, CAP_ACK};
use super::resume::{Mark, Resume};
use crate::core::model::Timestamp;
use crate::core::store::sessions::{ArmLine, Sessions, UnaskedArm};
use crate::core::trainer::{Ending, Hello, Peer};
use crate::outputs::record::{Recorder, Trace};

const SERVER: &str = concat!("gpumon/", env!("CARGO_PKG_VERSION"));
/// Seconds between two `rate_limited` replies on one connection: one per line would flood a
/// client that is already sending too much, and may not be reading.
const LIMITED_REPLY_EVERY: f64 = 1.0;
/// An `ack` goes out when this long has passed since the last one, or this many numbered lines
/// went unacknowledged: a client at 100 lines/s gets about ten a second, not one per line.
const ACK_EVERY: f64 = 0.1;
const ACK_LINES: u64 = 64;
/// The event kind a session closed for going quiet ends with, in the store and in its trace.
pub const IDLE_TIMEOUT: &str = "idle_timeout";

pub struct Conn {
    peer: Peer,
    /// Session key once hello was accepted.
    session: Option<u64>,
    line: u64,
    said_bye: bool,
    recorder: Option<Arc<Recorder>>,
    trace: Option<Trace>,
    /// Lines per second this connection may send (announced in its welcome).
    rate_limit: Option<u32>,
    /// When the last `rate_limited` reply went out, and lines dropped since.
    limited_reply: Option<Timestamp>,
    limited_dropped: u64,
    /// Acknowledgements (capability `ack`): the marks table, this client's mark once its hello
    /// asked for acks, the highest `seq` taken on this connection, and the last acknowledged.
    resume: Option<Arc<Resume>>,
    mark: Option<Arc<Mark>>,
    taken: u64,
    acked: u64,
    ack_sent: Option<Timestamp>,
    /// NVML's figure for the session as its trace last noted it.
    nvml_noted: Option<crate::core::store::sessions::nvml::NvmlFigure>,
}

/// What begins each part of a session's trace: the hello as received and, when the daemon
/// knows the GPU its `gpu_uuid` names, a `trace_gpu` line, so `gpumon analyze` names it too.
fn trace_header(raw: &[u8], h: &Hello, sessions: &Sessions, now: Timestamp) -> Vec<u8> {
    let mut header = raw.to_vec();
    let uuid = h.gpu_uuid.as_deref();
    let gpu = uuid
        .zip(sessions.devices.as_ref())
        .and_then(|(u, d)| d.gpu_index_of(u));
    if let (Some(uuid), Some(gpu)) = (uuid, gpu) {
        header.push(b'\n');
        header.extend_from_slice(&crate::core::trace::gpu_line(gpu, uuid, now));
    }
    header
}

/// What the caller should do after a line.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    /// Send this line back (welcome or error); `rejected` carries the code to count.
    Reply {
        line: Vec<u8>,
        rejected: Option<Code>,
    },
    /// Bye received: the session ended cleanly; the connection may close.
    Bye,
    /// A numbered line this client's instance already sent (a resend after a reconnect):
    /// dropped, counted, no reply.
    Duplicate,
}

impl Conn {
    pub fn new(peer: Peer) -> Self {
        Self {
            peer,
            session: None,
            line: 0,
            said_bye: false,
            recorder: None,
            trace: None,
            rate_limit: None,
            limited_reply: None,
            limited_dropped: 0,
            resume: None,
            mark: None,
            taken: 0,
            acked: 0,
            ack_sent: None,
            nvml_noted: None,
        }
    }

    /// Acknowledges numbered lines to clients that ask (hello `caps` has `ack`), dropping lines
    /// an instance sends twice, against the marks in `resume`.
    pub fn acking(mut self, resume: Arc<Resume>) -> Self {
        self.resume = Some(resume);
        self
    }

    /// The connection's line rate limit, announced in the welcome and named in `rate_limited`.
    pub fn rate_limited(mut self, lines_per_second: u32) -> Self {
        self.rate_limit = Some(lines_per_second);
        self
    }

    /// Records this connection's session as a trace file (`--record-dir`).
    pub fn recording(mut self, recorder: Option<Arc<Recorder>>) -> Self {
        self.recorder = recorder;
        self
    }

    /// Whether this connection's session is recorded (its lines' bytes are needed).
    pub fn records(&self) -> bool {
        self.recorder.is_some()
    }

    /// The key of this connection's session, once hello was accepted.
    pub fn session(&self) -> Option<u64> {
        self.session
    }

    pub fn line_number(&self) -> u64 {
        self.line
    }

    /// A hello was accepted on this connection (its session may have ended with bye since).
    pub fn greeted(&self) -> bool {
        self.session.is_some() || self.said_bye
    }

    /// A rejection found before parsing (over-long line, rate limit).
    pub fn reject(&mut self, r: Rejection) -> Outcome {
        self.line += 1;
        self.error(r)
    }

    /// A line dropped for the rate limit: it still counts as a line (later errors keep their
    /// line numbers), and gets a `rate_limited` reply at most once a second, telling how many
    /// were dropped since the last one. None: dropped without a reply.
    pub fn over_limit(&mut self, now: Timestamp) -> Option<Outcome> {
        self.line += 1;
        self.limited_dropped += 1;
        // abs(): a wall clock stepped back must not silence the replies for good.
        if self
            .limited_reply
            .is_some_and(|t| (now - t).abs() < LIMITED_REPLY_EVERY)
        {
            return None;
        }
        let dropped = std::mem::take(&mut self.limited_dropped);
        let msg = match self.rate_limit {
            Some(n) => format!(
                "more than {n} lines/s (ingest.max_lines_per_second): {dropped} line(s) dropped since the last notice; the connection stays open. Send fewer samples (the welcome's max_lines_per_second is the limit), or raise the limit"
            ),
            None => format!("over the line rate limit: {dropped} line(s) dropped"),
        };
        self.limited_reply = Some(now);
        Some(self.error(Rejection::new(Code::RateLimited, msg)))
    }

    fn error(&self, r: Rejection) -> Outcome {
        Outcome::Reply {
            line: Reply::Error {
                code: r.code,
                line: self.line,
                message: &r.message,
            }
            .to_line(),
            rejected: Some(r.code),
        }
    }

    pub fn handle(&mut self, raw: &[u8], sessions: &mut Sessions, now: Timestamp) -> Outcome {
        match protocol::parse_numbered(raw) {
            Ok((msg, seq)) => self.apply(msg, raw, seq, sessions, now),
            Err(r) => self.reject(r),
        }
    }

    /// A line already parsed from `raw` (the server parses a batch on its own task, then
    /// applies it as one aggregator input); counts as the connection's next line, like `handle`.
    pub fn apply(
        &mut self,
        msg: Message,
        raw: &[u8],
        seq: Option<u64>,
        sessions: &mut Sessions,
        now: Timestamp,
    ) -> Outcome {
        self.line += 1;
        if let (Some(seq), Some(mark), Some(_)) = (seq, &self.mark, self.session) {
            self.taken = self.taken.max(seq);
            if !mark.advance(seq) {
                return Outcome::Duplicate;
            }
        }
        let seq = seq.unwrap_or(0);
        match (msg, self.session) {
            (Message::Hello(h), None) => {
                self.mark = match &self.resume {
                    Some(r) if h.can(CAP_ACK) => Some(r.mark(self.peer.uid, h.instance.as_deref())),
                    _ => None,
                };
                let (job, rank) = (h.job.clone(), h.rank);
                let header = self.recorder.as_ref().map(|_| trace_header(raw, &h, sessions, now));
                let (key, id) = sessions.open(self.peer, h, now);
                self.session = Some(key);
                self.trace = self
                    .recorder
                    .as_ref()
                    .zip(header)
                    .map(|(r, header)| r.start(&id, job.as_deref(), rank, now, &header));
                let welcome = Reply::Welcome {
                    v: protocol::VERSION,
                    server: SERVER,
                    session: &id,
                    max_lines_per_second: self.rate_limit,
                    ack: self.mark.is_some(),
                };
                Outcome::Reply {
                    line: welcome.to_line(),
                    rejected: None,
                }
            }
            (Message::Hello(_), Some(_)) => self.error(Rejection::new(
                Code::DuplicateHello,
                "hello was already accepted on this connection; open a new connection for another device",
            )),
            (_, None) => self.error(Rejection::new(
                Code::NoHello,
                "send hello first: {\"type\":\"hello\",\"v\":1,...}",
            )),
            (Message::Sample(s), Some(key)) => {
                if self.trace.is_some() {
                    // The figure this sample is paired with, ahead of it, as analyze replays it.
                    if let Some(line) = sessions.nvml_line(key, &mut self.nvml_noted) {
                        self.record(&line, 0);
                    }
                }
                sessions.sample(key, s, now);
                self.record(raw, seq);
                Outcome::Accepted
            }
            (Message::Event(e), Some(key)) => {
                sessions.event(key, e);
                self.record(raw, seq);
                Outcome::Accepted
            }
            (Message::Attribution(a), Some(key)) => match sessions.attribution(key, a) {
                Ok(()) => {
                    self.record(raw, seq);
                    Outcome::Accepted
                }
                Err(unasked) => self.error(unasked.into()),
            },
            (Message::Armed(a), Some(key)) => self.answer(sessions.armed(key, a), raw, seq),
            (Message::Peak(p), Some(key)) => self.answer(sessions.peak(key, p), raw, seq),
            (Message::Bye { .. }, Some(key)) => {
                sessions.close(key, Ending::Clean, now);
                self.record(raw, seq);
                self.trace = None;
                self.session = None;
                self.said_bye = true;
                Outcome::Bye
            }
        }
    }

    /// An answer to an arm request: recorded when it answered one, else a `bad_field`.
    fn answer(&mut self, r: Result<(), UnaskedArm>, raw: &[u8], seq: u64) -> Outcome {
        match r {
            Ok(()) => {
                self.record(raw, seq);
                Outcome::Accepted
            }
            Err(unasked) => self.error(unasked.into()),
        }
    }

    /// The requests this connection's session is due to send its trainer now, as lines, added
    /// to `out`: an `attribute`, an `arm` or `disarm`, or both.
    pub fn requests(&self, sessions: &mut Sessions, now: Timestamp, out: &mut Vec<Vec<u8>>) {
        let Some(key) = self.session else { return };
        if let Some(r) = sessions.request_due(key, now) {
            out.push(
                Reply::Attribute {
                    v: protocol::ATTRIBUTE_VERSION,
                    id: r.id,
                    finding: &r.finding,
                    steps: r.steps,
                    seconds: r.seconds,
                    max_entries: r.max_entries,
                    top: r.top,
                }
                .to_line(),
            );
        }
        let line = match sessions.arm_due(key, now) {
            Some(ArmLine::Arm(r)) => Reply::Arm {
                v: protocol::ARM_VERSION,
                id: r.id,
                finding: &r.finding,
                seconds: r.seconds,
                max_entries: r.max_entries,
                peak_after_steps: r.peak_after_steps,
            }
            .to_line(),
            Some(ArmLine::Disarm { id }) => Reply::Disarm {
                v: protocol::ARM_VERSION,
                id,
            }
            .to_line(),
            None => return,
        };
        out.push(line);
    }

    /// The first request due now, as a line (tests).
    #[cfg(test)]
    pub fn request(&self, sessions: &mut Sessions, now: Timestamp) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.requests(sessions, now, &mut out);
        out.into_iter().next()
    }

    /// An `ack` line when one is due: the highest `seq` taken on this connection, held back
    /// to what the trace file holds while the session is recorded, so that no acknowledged
    /// line is missing from the trace if the daemon dies. Lines refused or dropped for the rate
    /// limit are covered by the next ack (they had their own reply; resending would not help).
    pub fn ack_due(&mut self, now: Timestamp) -> Option<Vec<u8>> {
        self.mark.as_ref()?;
        let upto = match &self.trace {
            Some(t) if t.recording() => self.taken.min(t.durable()),
            _ => self.taken,
        };
        let waited = self.ack_sent.is_none_or(|t| (now - t).abs() >= ACK_EVERY);
        if upto <= self.acked || !(waited || upto - self.acked >= ACK_LINES) {
            return None;
        }
        self.acked = upto;
        self.ack_sent = Some(now);
        Some(Reply::Ack { seq: upto }.to_line())
    }

    fn record(&mut self, raw: &[u8], seq: u64) {
        if let Some(t) = self.trace.as_mut() {
            t.write(raw, seq);
        }
    }

    /// The daemon is shutting down: the session ends without a crash finding, and its trace
    /// says so, so `gpumon analyze` reads a daemon stop, not a crash.
    pub fn close_for_shutdown(mut self, sessions: &mut Sessions, now: Timestamp) {
        if let Some(key) = self.session {
            let line = crate::core::trace::ended_line(crate::core::trace::DAEMON_STOPPED, now);
            self.record(&line, 0);
            sessions.close_as(key, Ending::Clean, now, crate::core::trace::DAEMON_STOPPED);
        }
    }

    /// The daemon closed a connection that went quiet: the trainer may well be alive (stuck, or
    /// between steps longer than the idle timeout), so the session ends without a crash
    /// finding, and an `idle_timeout` event says why it ended.
    pub fn close_idle(mut self, sessions: &mut Sessions, now: Timestamp, detail: String) {
        if let Some(key) = self.session {
            // In the trace too, so `gpumon analyze` reads the end as the daemon did: no crash.
            let line = serde_json::json!({
                "type": "event", "ts": now, "kind": IDLE_TIMEOUT, "detail": &detail,
            });
            self.record(line.to_string().as_bytes(), 0);
            let e = crate::core::trainer::Event {
                ts: now,
                kind: IDLE_TIMEOUT.into(),
                alloc_bytes: None,
                device_free: None,
                alloc_limit: None,
                phase: None,
                detail: Some(detail),
                path: None,
                dropped: None,
                explanation: None,
            };
            sessions.event(key, e);
            sessions.close_as(key, Ending::Clean, now, IDLE_TIMEOUT);
        }
    }

    /// The connection ended: without bye, the session is recorded as a crash.
    pub fn close(self, sessions: &mut Sessions, now: Timestamp) {
        if let Some(key) = self.session {
            sessions.close(key, Ending::Crash, now);
        }
    }
}

#[cfg(test)]
mod arm_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store::sessions::SessionLimits;
    use crate::outputs::record::Caps;

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
        let mut s = Sessions::new(SessionLimits::default());
        let mut c = Conn::new(PEER);
        let (welcome, rej) = reply_of(c.handle(HELLO, &mut s, 1.0));
        assert_eq!(rej, None);
        assert!(welcome.contains(r#""type":"welcome""#) && welcome.contains(r#""session":"s-1""#));
        assert_eq!(c.handle(SAMPLE, &mut s, 2.0), Outcome::Accepted);
        let sess = s.live().next().unwrap();
        assert_eq!(sess.peer.pid, 77);
        assert_eq!(sess.hello.ns_pid, Some(5));
        assert_eq!(sess.samples, 1);
        assert_eq!(c.handle(br#"{"type":"bye"}"#, &mut s, 3.0), Outcome::Bye);
        c.close(&mut s, 4.0);
        assert_eq!(s.ended().next().unwrap().ended, Some((3.0, Ending::Clean)));
    }

    #[test]
    fn sample_before_hello_and_second_hello_are_refused_but_the_connection_goes_on() {
        let mut s = Sessions::new(SessionLimits::default());
        let mut c = Conn::new(PEER);
        let (e, code) = reply_of(c.handle(SAMPLE, &mut s, 1.0));
        assert_eq!(code, Some(Code::NoHello));
        assert!(e.contains(r#""line":1"#));
        reply_of(c.handle(HELLO, &mut s, 1.0));
        let (_, code) = reply_of(c.handle(HELLO, &mut s, 1.0));
        assert_eq!(code, Some(Code::DuplicateHello));
        let (e, code) = reply_of(c.handle(b"garbage", &mut s, 1.0));
        assert_eq!(code, Some(Code::BadJson));
        assert!(e.contains(r#""line":4"#));
        assert_eq!(c.handle(SAMPLE, &mut s, 2.0), Outcome::Accepted);
        assert_eq!(s.live_count(), 1);
    }

    #[test]
    fn close_without_bye_is_a_crash() {
        let mut s = Sessions::new(SessionLimits::default());
        let mut c = Conn::new(PEER);
        reply_of(c.handle(HELLO, &mut s, 1.0));
        c.close(&mut s, 9.0);
        let ended = s.ended().next().unwrap();
        assert_eq!(ended.ended, Some((9.0, Ending::Crash)));
        assert_eq!(ended.events.back().unwrap().kind, "crash");
    }

    /// A line of a trainer whose floor grows 4 MiB a step on a 16 GiB device.
    #[test]
    fn the_welcome_names_the_rate_limit_and_over_it_a_notice_goes_out_once_a_second() {
        let mut s = Sessions::new(SessionLimits::default());
        let (plain, _) = reply_of(Conn::new(PEER).handle(HELLO, &mut s, 1.0));
        assert!(!plain.contains("max_lines_per_second"), "{plain}");
        let mut c = Conn::new(PEER).rate_limited(40);
        let (welcome, _) = reply_of(c.handle(HELLO, &mut s, 1.0));
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
        assert_eq!(c.handle(br#"{"type":"bye"}"#, &mut s, 12.0), Outcome::Bye);
        assert_eq!(
            s.ended().last().unwrap().ended.map(|(_, e)| e),
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
    fn asked(hello: &[u8], s: &mut Sessions, c: &mut Conn) -> Option<serde_json::Value> {
        reply_of(c.handle(hello, s, 1.0));
        (1..2000).find_map(|step| {
            assert_eq!(c.handle(&leaking(step), s, 2.0), Outcome::Accepted);
            let line = c.request(s, 1_763_700_000.0 + step as f64 * 0.1)?;
            assert!(line.ends_with(b"\n"));
            Some(serde_json::from_slice(&line).unwrap())
        })
    }

    #[test]
    fn a_capable_trainer_is_asked_and_its_answer_lands_on_the_finding() {
        use crate::core::store::sessions::AttributionPolicy;
        let mut s =
            Sessions::new(SessionLimits::default()).with_attribution(AttributionPolicy::default());
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
        let (e, code) = reply_of(c.handle(answer(2).as_bytes(), &mut s, 3.0));
        assert_eq!(code, Some(Code::BadField));
        assert!(e.contains("id 2 answers no open request"), "{e}");
        assert_eq!(
            c.handle(answer(1).as_bytes(), &mut s, 3.0),
            Outcome::Accepted
        );
        let leak = s.live().next().unwrap().detect.leak().unwrap();
        assert!(leak.message.contains("train.py:27"), "{}", leak.message);
        assert_eq!(
            c.request(&mut s, 1e10),
            None,
            "answered: nothing more to ask"
        );
    }

    #[test]
    fn a_trainer_without_the_capability_is_never_asked() {
        use crate::core::store::sessions::AttributionPolicy;
        let mut s =
            Sessions::new(SessionLimits::default()).with_attribution(AttributionPolicy::default());
        let mut c = Conn::new(PEER);
        assert_eq!(asked(HELLO, &mut s, &mut c), None);
        assert!(
            s.live().next().unwrap().detect.leak().is_some(),
            "the leak was raised"
        );
        // And an attribution it sends anyway answers nothing.
        let (_, code) = reply_of(c.handle(
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
        let mut s = Sessions::new(SessionLimits::default());
        let mut c = Conn::new(PEER).acking(Arc::default());
        let (welcome, _) = reply_of(c.handle(ACKING, &mut s, 1.0));
        assert!(welcome.contains(r#""ack":true"#), "{welcome}");
        assert_eq!(c.ack_due(1.0), None, "nothing numbered yet");
        assert_eq!(c.handle(&numbered(1), &mut s, 1.0), Outcome::Accepted);
        assert_eq!(c.ack_due(1.0).unwrap(), b"{\"type\":\"ack\",\"seq\":1}\n");
        for seq in 2..=10 {
            c.handle(&numbered(seq), &mut s, 1.0);
        }
        assert_eq!(c.ack_due(1.05), None, "too soon, too few");
        assert_eq!(c.ack_due(1.11).unwrap(), b"{\"type\":\"ack\",\"seq\":10}\n");
        for seq in 11..=74 {
            c.handle(&numbered(seq), &mut s, 1.0);
        }
        assert_eq!(c.ack_due(1.12).unwrap(), b"{\"type\":\"ack\",\"seq\":74}\n");
        // Without the capability: no ack in the welcome, none sent, seq ignored.
        let mut plain = Conn::new(PEER).acking(Arc::default());
        let (welcome, _) = reply_of(plain.handle(HELLO, &mut s, 1.0));
        assert!(!welcome.contains("ack"), "{welcome}");
        assert_eq!(plain.handle(&numbered(1), &mut s, 1.0), Outcome::Accepted);
        assert_eq!(plain.handle(&numbered(1), &mut s, 1.0), Outcome::Accepted);
        assert_eq!(plain.ack_due(9.0), None);
    }

    #[test]
    fn lines_resent_on_a_new_connection_are_dropped_once_applied() {
        let mut s = Sessions::new(SessionLimits::default());
        let resume = Arc::new(Resume::default());
        let mut first = Conn::new(PEER).acking(resume.clone());
        reply_of(first.handle(ACKING, &mut s, 1.0));
        for seq in 1..=5 {
            first.handle(&numbered(seq), &mut s, 1.0);
        }
        // The new connection says hello before the old one is seen closing.
        let mut second = Conn::new(PEER).acking(resume.clone());
        reply_of(second.handle(ACKING, &mut s, 2.0));
        first.close(&mut s, 2.0);
        let outcomes: Vec<_> = (3..=7)
            .map(|seq| second.handle(&numbered(seq), &mut s, 2.0))
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
        let samples: u64 = s.live().chain(s.ended()).map(|x| x.samples).sum();
        assert_eq!(samples, 7, "each line applied once");
        // Resends are acknowledged too, so the client forgets them.
        assert_eq!(
            second.ack_due(3.0).unwrap(),
            b"{\"type\":\"ack\",\"seq\":7}\n"
        );
        // Another user cannot silence this client by borrowing its instance name.
        let other = Peer { uid: 1001, ..PEER };
        let mut third = Conn::new(other).acking(resume);
        reply_of(third.handle(ACKING, &mut s, 3.0));
        assert_eq!(third.handle(&numbered(2), &mut s, 3.0), Outcome::Accepted);
    }

    #[test]
    fn a_recorded_session_is_acknowledged_only_as_far_as_its_trace_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Box::leak(Box::new(crate::outputs::record::RecordStats::new()));
        let rec = Recorder::with_stats(dir.path(), Caps::bytes(1 << 30, 1 << 30), stats).unwrap();
        let mut s = Sessions::new(SessionLimits::default());
        let mut c = Conn::new(PEER)
            .acking(Arc::default())
            .recording(Some(rec.clone()));
        reply_of(c.handle(ACKING, &mut s, 1.0));
        c.handle(&numbered(1), &mut s, 1.0);
        assert_eq!(
            c.ack_due(5.0),
            None,
            "line 1 is still in the trace's buffer"
        );
        // 64 KiB of lines send the buffer to the recorder thread, which writes it.
        let mut seq = 1;
        while c.trace.as_ref().unwrap().durable() == 0 && seq < 100_000 {
            seq += 1;
            c.handle(&numbered(seq), &mut s, 1.0);
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
        let stats = Box::leak(Box::new(crate::outputs::record::RecordStats::new()));
        let rec = Recorder::with_stats(dir.path(), Caps::bytes(1 << 30, 1 << 30), stats).unwrap();
        let mut s = Sessions::new(SessionLimits::default());
        let mut c = Conn::new(PEER).recording(Some(rec.clone()));
        reply_of(c.handle(HELLO, &mut s, 1.0));
        c.handle(SAMPLE, &mut s, 1.0);
        c.close_idle(&mut s, 901.0, "nothing sent for 900 s".into());
        rec.finish();
        let text: String = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
            .collect();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["kind"], IDLE_TIMEOUT, "{text}");
        assert_eq!(last["detail"], "nothing sent for 900 s");
        assert_eq!(
            s.ended().next().unwrap().ended,
            Some((901.0, Ending::Clean))
        );
    }
}
