//! Target `parse`: any bytes through the line parser. It must never panic; an accepted message
//! must respect every bound docs/protocol.md promises and survive being written back as JSON
//! and parsed again; a rejection must become one JSON error line whose message is short, so a
//! hostile line is never echoed back at length.

use gpumon::core::detect::attribution::{MAX_SITES, MAX_STACK, MAX_STR};
use gpumon::core::trainer::Stats;
use gpumon::sources::ingest::protocol::{self, Code, Message, Reply, MAX_LINE};
use serde_json::{json, Map, Value};

/// Longest error message a rejection may carry: client values are quoted clipped.
pub const MAX_MESSAGE: usize = 512;
const MAX_BYTES: u64 = 1 << 50;
const MAX_LABEL: usize = 128;
const MAX_TEXT: usize = 4096;

pub fn check(data: &[u8]) {
    match protocol::parse(data) {
        Ok(msg) => {
            assert!(data.len() <= MAX_LINE, "accepted a line of {}", data.len());
            check_bounds(&msg);
            round_trip(&msg);
        }
        Err(r) => {
            if data.len() > MAX_LINE {
                assert_eq!(r.code, Code::LineTooLong);
            }
            assert!(!r.message.is_empty(), "{:?} without a message", r.code);
            assert!(
                r.message.len() <= MAX_MESSAGE,
                "{:?} message of {} bytes: {:.200}",
                r.code,
                r.message.len(),
                r.message
            );
            let line = Reply::Error {
                code: r.code,
                line: 7,
                message: &r.message,
            }
            .to_line();
            check_error_line(&line, r.code, 7, Some(&r.message));
        }
    }
}

/// `line` is one `error` reply for `code` at line `line_no` (with `message`, when given).
pub fn check_error_line(line: &[u8], code: Code, line_no: u64, message: Option<&str>) {
    let v = one_json_line(line);
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["code"], code.as_str(), "{v}");
    assert_eq!(v["line"], line_no, "{v}");
    let text = v["message"].as_str().unwrap_or_default();
    assert!(!text.is_empty(), "{v}");
    if let Some(m) = message {
        assert_eq!(text, m);
    }
}

/// Parses a reply: exactly one newline, at the end, around one JSON object.
pub fn one_json_line(line: &[u8]) -> Value {
    assert_eq!(line.last(), Some(&b'\n'), "reply without its newline");
    assert_eq!(
        line.iter().filter(|&&c| c == b'\n').count(),
        1,
        "reply spans lines: {:?}",
        String::from_utf8_lossy(line)
    );
    match serde_json::from_slice(line) {
        Ok(v @ Value::Object(_)) => v,
        other => panic!("reply is not a JSON object: {other:?}"),
    }
}

/// Sites of an attribution or a peak, and its error and detail, within the protocol's limits.
fn check_sites(sites: &[gpumon::core::detect::attribution::Site], texts: [&Option<String>; 2]) {
    assert!(sites.len() <= MAX_SITES, "accepted {} sites", sites.len());
    for t in texts {
        assert!(t.as_ref().is_none_or(|t| t.len() <= MAX_STR));
    }
    for s in sites {
        bytes(Some(s.bytes));
        bytes(Some(s.blocks));
        assert!(
            s.stack.len() <= MAX_STACK,
            "accepted {} frames",
            s.stack.len()
        );
        let frames = s.stack.iter().flat_map(|f| [&f.file, &f.function]);
        for t in [&s.file, &s.function]
            .into_iter()
            .chain(&s.note)
            .chain(frames)
        {
            assert!(t.len() <= MAX_STR, "accepted a string of {} bytes", t.len());
        }
    }
}

fn check_bounds(msg: &Message) {
    match msg {
        Message::Hello(h) => {
            assert_eq!(h.v, protocol::VERSION);
            for s in [&h.job, &h.gpu_uuid, &h.client, &h.torch, &h.allocator] {
                label(s.as_deref());
            }
            bytes(h.alloc_limit);
            assert!(h.caps.len() <= 16, "accepted {} caps", h.caps.len());
            assert!(
                h.caps.iter().all(|c| c.len() <= 32),
                "accepted caps {:?}",
                h.caps
            );
        }
        Message::Attribution(a) => {
            ts(a.ts);
            bytes(Some(a.total_growth_bytes));
            assert!(a.finding.is_none(), "the client named the finding");
            check_sites(&a.sites, [&a.error, &a.detail]);
        }
        Message::Peak(p) => {
            ts(p.ts);
            bytes(Some(p.peak_bytes));
            assert!(p.finding.is_none(), "the client named the finding");
            check_sites(&p.sites, [&p.error, &p.detail]);
        }
        Message::Armed(a) => {
            ts(a.ts);
            for t in [&a.error, &a.detail] {
                assert!(t.as_ref().is_none_or(|t| t.len() <= MAX_STR));
            }
        }
        Message::Sample(s) => {
            ts(s.ts);
            label(Some(s.phase.as_str()));
            stats(&s.stats);
            bytes(s.device_free);
            bytes(s.device_total);
            bytes(s.alloc_limit);
        }
        Message::Event(e) => {
            ts(e.ts);
            label(Some(e.kind.as_str()));
            label(e.phase.as_ref().map(|p| p.as_str()));
            bytes(e.alloc_bytes);
            bytes(e.device_free);
            bytes(e.alloc_limit);
            for t in [&e.detail, &e.path] {
                assert!(t.as_ref().is_none_or(|t| t.len() <= MAX_TEXT));
            }
        }
        Message::Bye { ts: t } => {
            if let Some(t) = t {
                ts(*t);
            }
        }
    }
}

fn ts(t: f64) {
    assert!(
        t.is_finite() && (946_684_800.0..4_102_444_800.0).contains(&t),
        "accepted ts {t}"
    );
}

fn label(s: Option<&str>) {
    assert!(
        s.is_none_or(|s| s.len() <= MAX_LABEL),
        "accepted label {s:?}"
    );
}

fn bytes(b: Option<u64>) {
    assert!(
        b.is_none_or(|b| b <= MAX_BYTES),
        "accepted byte count {b:?}"
    );
}

fn stats(s: &Stats) {
    for (_, v) in stats_keys(s) {
        bytes(v);
    }
}

fn stats_keys(s: &Stats) -> [(&'static str, Option<u64>); 11] {
    [
        ("allocated_bytes.all.current", s.allocated),
        ("allocated_bytes.all.peak", s.allocated_peak),
        ("reserved_bytes.all.current", s.reserved),
        ("active_bytes.all.current", s.active),
        ("inactive_split_bytes.all.current", s.inactive_split),
        ("requested_bytes.all.current", s.requested),
        ("num_alloc_retries", s.alloc_retries),
        ("num_ooms", s.ooms),
        ("num_sync_all_streams", s.sync_all_streams),
        ("num_device_alloc", s.device_alloc),
        ("num_device_free", s.device_free),
    ]
}

/// Writes the message back as the protocol's JSON and parses it again: what the daemon
/// accepted, a client can send (escapes, unicode and all).
fn round_trip(msg: &Message) {
    let mut obj = Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() {
            obj.insert(k.into(), v);
        }
    };
    match msg {
        Message::Hello(h) => {
            put("type", json!("hello"));
            put("v", json!(h.v));
            put("pid", json!(h.ns_pid));
            put("job", json!(h.job));
            put("rank", json!(h.rank));
            put("world_size", json!(h.world_size));
            put("cuda_device", json!(h.cuda_device));
            put("gpu_uuid", json!(h.gpu_uuid));
            put("client", json!(h.client));
            put("torch", json!(h.torch));
            put("allocator", json!(h.allocator));
            put("expandable_segments", json!(h.expandable_segments));
            put("alloc_limit", json!(h.alloc_limit));
            put("caps", json!(h.caps));
        }
        Message::Attribution(a) => {
            put("type", json!("attribution"));
            put("id", json!(a.id));
            put("ts", json!(a.ts));
            put("step_from", json!(a.step_from));
            put("step_to", json!(a.step_to));
            put("seconds", json!(a.seconds));
            put("total_growth_bytes", json!(a.total_growth_bytes));
            put("sites", json!(a.sites));
            put("error", json!(a.error));
            put("detail", json!(a.detail));
        }
        Message::Peak(p) => {
            put("type", json!("peak"));
            put("id", json!(p.id));
            put("ts", json!(p.ts));
            put("step_from", json!(p.step_from));
            put("step_to", json!(p.step_to));
            put("peak_bytes", json!(p.peak_bytes));
            put("sites", json!(p.sites));
            put("error", json!(p.error));
            put("detail", json!(p.detail));
        }
        Message::Armed(a) => {
            put("type", json!("armed"));
            put("id", json!(a.id));
            put("ts", json!(a.ts));
            put("error", json!(a.error));
            put("detail", json!(a.detail));
        }
        Message::Sample(s) => {
            put("type", json!("sample"));
            put("ts", json!(s.ts));
            put("step", json!(s.step));
            put("phase", json!(s.phase));
            let stats: Map<String, Value> = stats_keys(&s.stats)
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_string(), json!(v?))))
                .collect();
            put("stats", Value::Object(stats));
            put("device_free", json!(s.device_free));
            put("device_total", json!(s.device_total));
            put("alloc_limit", json!(s.alloc_limit));
        }
        Message::Event(e) => {
            put("type", json!("event"));
            put("ts", json!(e.ts));
            put("kind", json!(e.kind));
            put("alloc_bytes", json!(e.alloc_bytes));
            put("device_free", json!(e.device_free));
            put("alloc_limit", json!(e.alloc_limit));
            put("phase", json!(e.phase));
            put("detail", json!(e.detail));
            put("path", json!(e.path));
        }
        Message::Bye { ts } => {
            put("type", json!("bye"));
            put("ts", json!(ts));
        }
    }
    let line = Value::Object(obj).to_string();
    let again = protocol::parse(line.as_bytes())
        .unwrap_or_else(|e| panic!("re-encoded message refused: {e}\n{line}"));
    assert_eq!(normalise(again, msg), *msg, "{line}");
}

/// serde_json's default float parsing may land one ulp off a shortest-repr float; a ts that
/// close counts as the same.
fn normalise(mut again: Message, orig: &Message) -> Message {
    let close = |a: f64, b: f64| (a - b).abs() <= b.abs() * 1e-15;
    match (&mut again, orig) {
        (Message::Sample(a), Message::Sample(b)) if close(a.ts, b.ts) => a.ts = b.ts,
        (Message::Event(a), Message::Event(b)) if close(a.ts, b.ts) => a.ts = b.ts,
        (Message::Bye { ts: Some(a) }, Message::Bye { ts: Some(b) }) if close(*a, *b) => *a = *b,
        (Message::Attribution(a), Message::Attribution(b)) => {
            if close(a.ts, b.ts) {
                a.ts = b.ts;
            }
            if let (Some(x), Some(y)) = (a.seconds.as_mut(), b.seconds) {
                if close(*x, y) {
                    *x = y;
                }
            }
        }
        _ => {}
    }
    again
}
