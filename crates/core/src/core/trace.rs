//! The trace file format (protocol.md, "Trace files"): a session's protocol lines as received,
//! hello first, plus lines only the recorder writes. The recorder writes traces and `gpumon
//! analyze` reads them; both take the format from here rather than from the wire parser.

use serde::Deserialize;

/// Longest line, newline excluded: the protocol's limit, so any accepted line fits.
pub const MAX_LINE: usize = 65_536;

#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type")]
    kind: String,
}

/// The `type` of a JSON object line, if it is one.
pub fn line_type(line: &[u8]) -> Option<String> {
    serde_json::from_slice::<Head>(line).ok().map(|h| h.kind)
}

/// Whether `line` is a JSON object whose `type` is `hello` (how every trace begins).
pub fn is_hello(line: &[u8]) -> bool {
    line_type(line).is_some_and(|t| t == "hello")
}

/// The recorder's last line when recording stopped before the session ended, so a truncated
/// trace is not read as a crash.
pub fn truncated_line(reason: &str, ts: f64) -> Vec<u8> {
    format!("{{\"type\":\"trace_truncated\",\"reason\":\"{reason}\",\"ts\":{ts:.3}}}\n")
        .into_bytes()
}

/// The daemon's last line on the trace of a session still open when the daemon stopped (a
/// signal, a shutdown): the trainer may well go on, its next connection being another trace, so
/// `gpumon analyze` reads no crash into this end. No newline: written as a line of the session.
pub fn ended_line(reason: &str, ts: f64) -> Vec<u8> {
    format!("{{\"type\":\"trace_end\",\"reason\":\"{reason}\",\"ts\":{ts:.3}}}").into_bytes()
}

/// The daemon's last line on the trace of a session whose connection closed without bye: when
/// it closed, which no trainer line says (its last sample may be minutes older). `gpumon
/// analyze` dates the crash by it, so a job's ranks are ordered as the daemon saw them end.
pub fn closed_line(ts: f64) -> Vec<u8> {
    format!("{{\"type\":\"trace_closed\",\"ts\":{ts:.3}}}").into_bytes()
}

/// Why the daemon ended a trace it wrote `trace_end` on.
pub const DAEMON_STOPPED: &str = "daemon_stopped";

/// The recorder's note of the GPU the daemon resolved the session's `gpu_uuid` to (its NVML
/// index; for a MIG instance, its parent's), so offline reports name the GPU live ones did.
/// No newline: it joins the hello in the header every part of a trace begins with.
pub fn gpu_line(gpu: u32, uuid: &str, ts: f64) -> Vec<u8> {
    // `type` first, as in every other line; the UUID came from a client, so it is escaped.
    let uuid = serde_json::Value::from(uuid);
    format!("{{\"type\":\"trace_gpu\",\"gpu\":\"{gpu}\",\"gpu_uuid\":{uuid},\"ts\":{ts:.3}}}")
        .into_bytes()
}

/// The recorder's note of the host it records on, in the header every part of a trace begins
/// with: `gpumon analyze` over several nodes' record directories names where a job's first
/// failure happened. No newline, as `gpu_line`.
pub fn host_line(host: &str, ts: f64) -> Vec<u8> {
    let host = serde_json::Value::from(host);
    format!("{{\"type\":\"trace_host\",\"host\":{host},\"ts\":{ts:.3}}}").into_bytes()
}

/// The recorder's note of the session's socket peer: the uid the kernel gave for the
/// connection (SO_PEERCRED), never the client's word, in the header every part of a trace
/// begins with. `gpumon analyze` groups jobs by it, as the daemon did. No newline, as
/// `gpu_line`.
pub fn peer_line(uid: u32, ts: f64) -> Vec<u8> {
    format!("{{\"type\":\"trace_peer\",\"uid\":{uid},\"ts\":{ts:.3}}}").into_bytes()
}

/// The recorder's note, after the hello of a session's first part, of the trace the same client
/// (hello's `instance`) wrote last: its connection before a daemon restart or a reconnect, so
/// `gpumon analyze` can read the two as one run. `file` is a name in the same directory.
pub fn resumes_line(file: &str, ts: f64) -> Vec<u8> {
    let file = serde_json::Value::from(file);
    format!("{{\"type\":\"trace_resumes\",\"file\":{file},\"ts\":{ts:.3}}}\n").into_bytes()
}

/// The recorder's note of NVML's figure for the session's process on its GPU (`used_bytes`,
/// polled at `ts`), written when it changes: `gpumon analyze` pairs the samples after it with it,
/// as the daemon did. Without `used_bytes`, the daemon had no figure of the process's own from
/// then on. No newline: written as a line of the session.
pub fn nvml_line(used: Option<u64>, ts: Option<f64>) -> Vec<u8> {
    match (used, ts) {
        (Some(used), Some(ts)) => {
            format!("{{\"type\":\"trace_nvml\",\"used_bytes\":{used},\"ts\":{ts:.3}}}")
        }
        _ => "{\"type\":\"trace_nvml\"}".to_string(),
    }
    .into_bytes()
}

/// The `instance` a hello line names, if any.
pub fn hello_instance(line: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Instance {
        instance: Option<String>,
    }
    serde_json::from_slice::<Instance>(line).ok()?.instance
}

/// A line only the recorder writes.
#[derive(Debug, Clone, PartialEq)]
pub enum RecorderLine {
    /// `trace_truncated`, with its reason.
    Truncated(String),
    /// `trace_gpu`: the GPU index (a label value, a string, in the line).
    Gpu(u32),
    /// `trace_end`, with its reason: the daemon stopped while the session was open.
    Ended(String),
    /// `trace_resumes`: the file this trace continues.
    Resumes(String),
    /// `trace_host`: the host the daemon recorded on.
    Host(String),
    /// `trace_peer`: the session's uid, as the daemon read it off the socket.
    Peer(u32),
    /// `trace_closed`: when the connection closed without bye.
    Closed(f64),
    /// `trace_nvml`: NVML's figure for the process and when it was polled; none when the
    /// daemon had none of the process's own.
    Nvml(Option<u64>, Option<f64>),
}

/// The recorder line `line` is, if it is one (protocol lines are left to the protocol parser).
pub fn recorder_line(line: &[u8]) -> Option<RecorderLine> {
    #[derive(Deserialize)]
    struct Marker {
        #[serde(rename = "type")]
        kind: String,
        reason: Option<String>,
        gpu: Option<String>,
        file: Option<String>,
        host: Option<String>,
        uid: Option<u32>,
        used_bytes: Option<u64>,
        ts: Option<f64>,
    }
    // A cheap look first: nearly every line is a sample.
    memchr::memmem::find(line, b"\"trace_")?;
    let m: Marker = serde_json::from_slice(line).ok()?;
    match m.kind.as_str() {
        "trace_truncated" => Some(RecorderLine::Truncated(
            m.reason.unwrap_or_else(|| "no reason given".into()),
        )),
        "trace_gpu" => Some(RecorderLine::Gpu(m.gpu?.parse().ok()?)),
        "trace_end" => Some(RecorderLine::Ended(
            m.reason.unwrap_or_else(|| "no reason given".into()),
        )),
        "trace_resumes" => Some(RecorderLine::Resumes(m.file?)),
        "trace_host" => Some(RecorderLine::Host(m.host?)),
        "trace_peer" => Some(RecorderLine::Peer(m.uid?)),
        "trace_closed" => Some(RecorderLine::Closed(m.ts.filter(|t| t.is_finite())?)),
        "trace_nvml" => Some(match (m.used_bytes, m.ts) {
            (Some(used), Some(ts)) if ts.is_finite() => RecorderLine::Nvml(Some(used), Some(ts)),
            _ => RecorderLine::Nvml(None, None),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
