//! The ingest protocol's wire format (docs/protocol.md): one JSON object per line in; `welcome`,
//! `error` and `attribute` (a request) lines out. Parsing is typed and borrows from the line,
//! because the daemon must keep up with hundreds of thousands of samples a second; stats keys
//! it does not know are skipped without allocating.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use crate::core::message::Message;
use crate::core::trainer::{Event, EventKind, Hello, Phase, Sample, Stats};

mod attribution;
mod categories;
mod ending;
mod explanation;
mod peak;
mod reply;
mod stats;

pub use reply::Reply;

use stats::RawStats;

/// The protocol version this daemon speaks.
pub const VERSION: u64 = 1;
/// The version of the `attribute` request (its own `v`).
pub const ATTRIBUTE_VERSION: u64 = 1;
/// The version of the `arm` and `disarm` requests (their own `v`).
pub const ARM_VERSION: u64 = 1;
/// Longest accepted line, newline excluded (traces hold the same lines).
pub use crate::core::trace::MAX_LINE;
/// Longest accepted label-like string (job, phase, kind, ...).
const MAX_LABEL: usize = 128;
/// Longest accepted free text (event detail, paths).
const MAX_TEXT: usize = 4096;
/// Largest byte count taken as real: 1 PiB. Beyond that the value is corrupt, not memory.
const MAX_BYTES: u64 = 1 << 50;
/// Most bytes of a client-supplied value quoted back in an error, escapes included: a hostile
/// line must not come back as a reply as long as itself.
const MAX_QUOTE: usize = 80;
/// Most bytes of a JSON decoder message, which quotes the offending value itself.
const MAX_DECODER_MESSAGE: usize = 240;
/// Capabilities a hello may list, at most, and the longest name.
const MAX_CAPS: usize = 16;
const MAX_CAP: usize = 32;
pub use crate::core::trainer::{CAP_ATTRIBUTION, CAP_OOM_HISTORY};
/// The capability to number lines (`seq`), take `ack`s and resend what was never acknowledged.
pub const CAP_ACK: &str = "ack";

/// Error codes of the protocol's `error` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    BadJson,
    LineTooLong,
    NoHello,
    DuplicateHello,
    UnsupportedVersion,
    UnknownType,
    BadField,
    RateLimited,
    TooManyConnections,
    /// A session closed to give its slot to another user (fair ingest slots).
    Evicted,
}

impl Code {
    pub const ALL: [Code; 10] = [
        Code::BadJson,
        Code::LineTooLong,
        Code::NoHello,
        Code::DuplicateHello,
        Code::UnsupportedVersion,
        Code::UnknownType,
        Code::BadField,
        Code::RateLimited,
        Code::TooManyConnections,
        Code::Evicted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::BadJson => "bad_json",
            Code::LineTooLong => "line_too_long",
            Code::NoHello => "no_hello",
            Code::DuplicateHello => "duplicate_hello",
            Code::UnsupportedVersion => "unsupported_version",
            Code::UnknownType => "unknown_type",
            Code::BadField => "bad_field",
            Code::RateLimited => "rate_limited",
            Code::TooManyConnections => "too_many_connections",
            Code::Evicted => "evicted",
        }
    }
}

/// A rejected line: the code and a message that names the bad value and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: Code,
    pub message: String,
}

impl Rejection {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// What the session's state refused, in the protocol's words.
impl From<crate::core::input::Refusal> for Rejection {
    fn from(r: crate::core::input::Refusal) -> Self {
        use crate::core::input::Refusal;
        match r {
            Refusal::NoHello => Rejection::new(
                Code::NoHello,
                "send hello first: {\"type\":\"hello\",\"v\":1,...}",
            ),
            Refusal::DuplicateHello => Rejection::new(
                Code::DuplicateHello,
                "hello was already accepted on this connection; open a new connection for another device",
            ),
            Refusal::Unasked(e) => e.into(),
            Refusal::UnaskedArm(e) => e.into(),
        }
    }
}

/// An attribution that answers no open request is a `bad_field`.
impl From<crate::core::store::sessions::Unasked> for Rejection {
    fn from(e: crate::core::store::sessions::Unasked) -> Self {
        Rejection::new(Code::BadField, e.to_string())
    }
}

/// An `armed` or `peak` that answers no open arm request is a `bad_field`.
impl From<crate::core::store::sessions::UnaskedArm> for Rejection {
    fn from(e: crate::core::store::sessions::UnaskedArm) -> Self {
        Rejection::new(Code::BadField, e.to_string())
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// Every field of every message type, all optional; the `type` decides which apply.
#[derive(Deserialize)]
struct Raw<'a> {
    #[serde(rename = "type", borrow)]
    msg_type: Option<Cow<'a, str>>,
    /// An event's kind (oom, phase, mark, snapshot).
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    v: Option<u64>,
    pid: Option<u64>,
    #[serde(borrow)]
    job: Option<Cow<'a, str>>,
    rank: Option<u64>,
    world_size: Option<u64>,
    cuda_device: Option<u64>,
    #[serde(borrow)]
    gpu_uuid: Option<Cow<'a, str>>,
    #[serde(borrow)]
    client: Option<Cow<'a, str>>,
    #[serde(borrow)]
    torch: Option<Cow<'a, str>>,
    #[serde(borrow)]
    allocator: Option<Cow<'a, str>>,
    expandable_segments: Option<bool>,
    #[serde(borrow)]
    alloc_conf: Option<Cow<'a, str>>,
    ts: Option<f64>,
    step: Option<u64>,
    #[serde(borrow)]
    phase: Option<Cow<'a, str>>,
    stats: Option<RawStats>,
    device_free: Option<u64>,
    device_total: Option<u64>,
    /// Taken as any JSON value so that a bad one is quoted back with the field's name.
    alloc_limit: Option<serde_json::Value>,
    alloc_bytes: Option<u64>,
    #[serde(borrow)]
    detail: Option<Cow<'a, str>>,
    #[serde(borrow)]
    path: Option<Cow<'a, str>>,
    /// hello: a list of capability names; taken as any value so a bad one can be named.
    caps: Option<serde_json::Value>,
    #[serde(borrow)]
    instance: Option<Cow<'a, str>>,
    #[serde(borrow)]
    run_id: Option<Cow<'a, str>>,
    restart: Option<u64>,
    /// Any line after hello: its number in the client's stream (capability `ack`).
    seq: Option<u64>,
    /// event: lines the client dropped before it.
    dropped: Option<u64>,
    /// event: how the trainer's process is ending (`signal`, `exception`), with its name.
    #[serde(borrow)]
    ending: Option<Cow<'a, str>>,
    #[serde(borrow)]
    signal: Option<Cow<'a, str>>,
    #[serde(borrow)]
    exception: Option<Cow<'a, str>>,
    /// attribution: the request answered, the window, and the sites (checked field by field).
    id: Option<u64>,
    step_from: Option<u64>,
    step_to: Option<u64>,
    seconds: Option<f64>,
    total_growth_bytes: Option<serde_json::Value>,
    /// peak: the highest live total over the recorded steps.
    peak_bytes: Option<serde_json::Value>,
    sites: Option<serde_json::Value>,
    #[serde(borrow)]
    error: Option<Cow<'a, str>>,
    /// event (oom): what the trainer's allocator showed at the OOM, checked field by field.
    explanation: Option<serde_json::Value>,
    /// sample: where the measured step's memory went (rare), checked field by field.
    categories: Option<serde_json::Value>,
}

/// Parses one line (without its newline).
pub fn parse(line: &[u8]) -> Result<Message, Rejection> {
    parse_numbered(line).map(|(m, _)| m)
}

/// Parses one line, with its `seq` when it carries one (and is not a hello, which is never
/// numbered: it belongs to its connection).
pub fn parse_numbered(line: &[u8]) -> Result<(Message, Option<u64>), Rejection> {
    if line.len() > MAX_LINE {
        return Err(Rejection::new(
            Code::LineTooLong,
            format!("line of {} bytes exceeds {MAX_LINE}", line.len()),
        ));
    }
    let text = std::str::from_utf8(line).map_err(|e| {
        Rejection::new(
            Code::BadJson,
            format!("line is not UTF-8 ({e}); send UTF-8 JSON, one object per line"),
        )
    })?;
    let raw: Raw = serde_json::from_str(text).map_err(|e| {
        use serde_json::error::Category;
        let code = match e.classify() {
            Category::Data => Code::BadField,
            _ => Code::BadJson,
        };
        let e = e.to_string();
        let e = shorten(&e, MAX_DECODER_MESSAGE);
        Rejection::new(code, format!("{e}; send one JSON object per line"))
    })?;
    let msg_type = raw.msg_type.clone().ok_or_else(|| {
        Rejection::new(
            Code::BadField,
            "missing \"type\"; every message needs one of hello, sample, event, attribution, armed, peak, bye",
        )
    })?;
    let seq = raw.seq.filter(|_| msg_type != "hello");
    let msg = match msg_type.as_ref() {
        "hello" => hello(raw).map(Message::Hello),
        "sample" => sample(raw).map(Message::Sample),
        "event" => event(raw).map(Message::Event),
        "attribution" => attribution::attribution(raw).map(Message::Attribution),
        "armed" => peak::armed(raw).map(Message::Armed),
        "peak" => peak::peak(raw).map(Message::Peak),
        "bye" => Ok(Message::Bye {
            ts: raw.ts.map(|t| ts("ts", t)).transpose()?,
        }),
        other => Err(Rejection::new(
            Code::UnknownType,
            format!(
                "unknown type {}; this daemon speaks hello, sample, event, attribution, armed, peak, bye",
                // Cut before escaping too, so a 64 KiB type costs no 64 KiB of escaping.
                shorten(&format!("{:?}", shorten(other, MAX_QUOTE)), MAX_QUOTE)
            ),
        )),
    }?;
    Ok((msg, seq))
}

fn hello(r: Raw) -> Result<Hello, Rejection> {
    let v = r
        .v
        .ok_or_else(|| Rejection::new(Code::BadField, "hello needs \"v\" (protocol version, 1)"))?;
    if v != VERSION {
        return Err(Rejection::new(
            Code::UnsupportedVersion,
            format!("protocol version {v} is not supported; this daemon speaks v{VERSION}: upgrade the daemon or pin the client"),
        ));
    }
    Ok(Hello {
        v,
        ns_pid: r.pid,
        job: label("job", r.job)?,
        rank: r.rank,
        world_size: r.world_size,
        cuda_device: r.cuda_device,
        gpu_uuid: label("gpu_uuid", r.gpu_uuid)?,
        client: label("client", r.client)?,
        torch: label("torch", r.torch)?,
        allocator: label("allocator", r.allocator)?,
        expandable_segments: r.expandable_segments,
        alloc_conf: label("alloc_conf", r.alloc_conf)?,
        alloc_limit: byte_value("alloc_limit", r.alloc_limit)?,
        caps: caps(r.caps)?,
        instance: label("instance", r.instance)?,
        run_id: label("run_id", r.run_id)?.filter(|r| !no_run_id(r)),
        restart: r.restart,
    })
}

/// A run id that names no run: empty, or torchrun's default `none` (its `--rdzv-id` when none
/// was given, the same for every static multi-node run), which would make every such run of a
/// job name one job.
pub fn no_run_id(r: &str) -> bool {
    let r = r.trim();
    r.is_empty() || r.eq_ignore_ascii_case("none")
}

/// `caps`: at most `MAX_CAPS` names of at most `MAX_CAP` bytes; anything else refuses the hello.
fn caps(v: Option<serde_json::Value>) -> Result<Vec<String>, Rejection> {
    let list = match v {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Array(list)) => list,
        Some(other) => return Err(not_a("caps", &other, "a list of capability names")),
    };
    if list.len() > MAX_CAPS {
        return Err(Rejection::new(
            Code::BadField,
            format!(
                "caps lists {} names; at most {MAX_CAPS} are accepted",
                list.len()
            ),
        ));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, c)| match c {
            serde_json::Value::String(s) if s.len() <= MAX_CAP => Ok(s),
            serde_json::Value::String(s) => Err(Rejection::new(
                Code::BadField,
                format!(
                    "caps[{i}] is {} bytes long; capability names are at most {MAX_CAP}",
                    s.len()
                ),
            )),
            other => Err(not_a(&format!("caps[{i}]"), &other, "a capability name")),
        })
        .collect()
}

/// `field = <value, clipped> is not <what>`, as a `bad_field`.
fn not_a(field: &str, v: &serde_json::Value, what: &str) -> Rejection {
    Rejection::new(
        Code::BadField,
        format!(
            "{field} = {} is not {what}",
            shorten(&v.to_string(), MAX_QUOTE)
        ),
    )
}

fn sample(r: Raw) -> Result<Sample, Rejection> {
    let stats = match r.stats {
        Some(RawStats { bad: Some(bad), .. }) => {
            return Err(Rejection::new(
                Code::BadField,
                format!(
                    "{bad}: stats values must be byte counts or counters, integers from 0 to 2^50"
                ),
            ))
        }
        Some(s) => s.stats,
        None => Stats::default(),
    };
    Ok(Sample {
        ts: ts("ts", required("sample", "ts", r.ts)?)?,
        step: r.step,
        phase: word("phase", r.phase.as_deref())?.map_or(Phase::Train, Phase::parse),
        stats,
        device_free: bytes("device_free", r.device_free)?,
        device_total: bytes("device_total", r.device_total)?,
        alloc_limit: byte_value("alloc_limit", r.alloc_limit)?,
        categories: categories::categories(r.categories)?,
    })
}

fn event(r: Raw) -> Result<Event, Rejection> {
    let kind = label("kind", r.kind)?
        .ok_or_else(|| {
            Rejection::new(
                Code::BadField,
                "event needs \"kind\" (oom, phase, mark, snapshot)",
            )
        })
        .map(|k| EventKind::parse(&k))?;
    let explanation = match r.explanation {
        None | Some(serde_json::Value::Null) => None,
        Some(_) if kind != EventKind::Oom => {
            return Err(Rejection::new(
                Code::BadField,
                format!(
                    "explanation on a {} event; only an oom event carries one",
                    shorten(&format!("{:?}", kind.as_str()), MAX_QUOTE)
                ),
            ))
        }
        Some(v) => Some(explanation::explanation(v)?),
    };
    let detail = text("detail", r.detail)?;
    let ending = ending::ending(r.ending, r.signal, r.exception, detail.as_deref())?;
    Ok(Event {
        ts: ts("ts", required("event", "ts", r.ts)?)?,
        kind,
        alloc_bytes: bytes("alloc_bytes", r.alloc_bytes)?,
        device_free: bytes("device_free", r.device_free)?,
        alloc_limit: byte_value("alloc_limit", r.alloc_limit)?,
        phase: word("phase", r.phase.as_deref())?.map(Phase::parse),
        detail,
        path: text("path", r.path)?,
        dropped: r.dropped,
        explanation,
        ending,
    })
}

fn required<T>(msg: &str, field: &str, v: Option<T>) -> Result<T, Rejection> {
    v.ok_or_else(|| Rejection::new(Code::BadField, format!("{msg} needs \"{field}\"")))
}

/// A Unix timestamp: finite and after 2000 and before 2100, else the client's clock or encoder
/// is broken and the sample would poison rate and ETA computations.
fn ts(field: &str, t: f64) -> Result<f64, Rejection> {
    if t.is_finite() && (946_684_800.0..4_102_444_800.0).contains(&t) {
        Ok(t)
    } else {
        Err(Rejection::new(
            Code::BadField,
            format!(
                "{field} = {} is not a Unix time in seconds (send time.time())",
                short_number(t)
            ),
        ))
    }
}

/// A number as written, or in exponent form when that is shorter: -1e308 in full is 309
/// characters of an error message.
fn short_number(t: f64) -> String {
    if t.abs() < 1e15 {
        t.to_string()
    } else {
        format!("{t:e}")
    }
}

fn bytes(field: &str, v: Option<u64>) -> Result<Option<u64>, Rejection> {
    match v {
        Some(b) if b > MAX_BYTES => Err(Rejection::new(
            Code::BadField,
            format!("{field} = {b} is not a plausible byte count (limit 2^50)"),
        )),
        other => Ok(other),
    }
}

/// A byte count that arrived as any JSON value: an integer up to 2^50, or a `bad_field` that
/// names the field and quotes the value.
fn byte_value(field: &str, v: Option<serde_json::Value>) -> Result<Option<u64>, Rejection> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some() => bytes(field, n.as_u64()),
        Some(other) => Err(Rejection::new(
            Code::BadField,
            format!(
                "{field} = {} is not a byte count; send an integer from 0 to 2^50",
                shorten(&other.to_string(), MAX_QUOTE)
            ),
        )),
    }
}

fn label(field: &str, v: Option<Cow<str>>) -> Result<Option<String>, Rejection> {
    bounded(field, v, MAX_LABEL)
}

fn text(field: &str, v: Option<Cow<str>>) -> Result<Option<String>, Rejection> {
    bounded(field, v, MAX_TEXT)
}

/// A label read in place, for what is parsed into a kind (every sample has a phase: no copy).
fn word<'s>(field: &str, v: Option<&'s str>) -> Result<Option<&'s str>, Rejection> {
    match v {
        Some(s) if s.len() > MAX_LABEL => Err(too_long(field, s, MAX_LABEL)),
        other => Ok(other),
    }
}

fn bounded(field: &str, v: Option<Cow<str>>, max: usize) -> Result<Option<String>, Rejection> {
    match v {
        Some(s) if s.len() > max => Err(too_long(field, &s, max)),
        other => Ok(other.map(Cow::into_owned)),
    }
}

fn too_long(field: &str, s: &str, max: usize) -> Rejection {
    Rejection::new(
        Code::BadField,
        format!("{field} is {} bytes long; keep it under {max}", s.len()),
    )
}

/// Text quoting a client-supplied value, cut to at most `max` bytes: its start and its end
/// (where a decoder says what it expected, and at which column) around a `...`.
fn shorten(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let half = (max - 3) / 2;
    let mut head = half;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - half;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    Cow::Owned(format!("{}...{}", &s[..head], &s[tail..]))
}

#[cfg(test)]
mod tests;
