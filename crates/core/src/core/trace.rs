//! The trace file format (protocol.md, "Trace files"): a session's protocol lines as received,
//! hello first, plus lines only the recorder writes. The recorder writes traces and `gpumon
//! analyze` reads them; both take the format from here rather than from the wire parser.

use serde::Deserialize;

pub mod file_name;

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
    /// `trace_unified`: the unified device's free and total bytes for the samples after it
    /// (unified.rs); none when the device's figures were no longer known.
    Unified(Option<crate::core::unified::Room>),
}

/// The recorder line `line` is, if it is one and valid (protocol lines are left to the
/// protocol parser).
pub fn recorder_line(line: &[u8]) -> Option<RecorderLine> {
    read_recorder_line(line)?.ok()
}

/// Byte counts the recorder writes: as the protocol's, up to 2^50.
pub const MAX_BYTES: u64 = 1 << 50;

/// A Unix time in seconds as the daemon's clock writes it: as the protocol requires of a
/// trainer's `ts`, after 2000 and before 2100. Anything else was not written by a daemon, and
/// would date a crash or a job's first failure centuries away.
pub fn valid_ts(t: f64) -> bool {
    t.is_finite() && (946_684_800.0..4_102_444_800.0).contains(&t)
}

/// The recorder line `line` is, if it is one: `Err` says which field holds what, and what a
/// valid value is, for a line of a recorder type (`trace_…`) that no daemon wrote so.
pub fn read_recorder_line(line: &[u8]) -> Option<Result<RecorderLine, String>> {
    use serde_json::Value;
    #[derive(Deserialize)]
    struct Marker {
        reason: Option<String>,
        gpu: Option<String>,
        file: Option<String>,
        host: Option<String>,
        // Numbers as any value, so one of the wrong type is named, not a parse error.
        uid: Option<Value>,
        used_bytes: Option<Value>,
        free_bytes: Option<Value>,
        total_bytes: Option<Value>,
        ts: Option<Value>,
    }
    // A cheap look first: nearly every line is a sample.
    memchr::memmem::find(line, b"\"trace_")?;
    let kind = line_type(line)?;
    let known = [
        "trace_truncated",
        "trace_gpu",
        "trace_end",
        "trace_resumes",
        "trace_host",
        "trace_peer",
        "trace_closed",
        "trace_nvml",
        "trace_unified",
    ];
    if !known.contains(&kind.as_str()) {
        return None;
    }
    let m: Marker = match serde_json::from_slice(line) {
        Ok(m) => m,
        Err(e) => return Some(Err(format!("{kind}: {e}"))),
    };
    if kind == "trace_unified" {
        return Some(unified_line(&m.free_bytes, &m.total_bytes));
    }
    Some(recorder(&kind, m.ts.as_ref(), m.used_bytes.as_ref()).and_then(|(ts, used)| {
        let needs = |field: &str| format!("{kind} needs \"{field}\"");
        Ok(match kind.as_str() {
            "trace_truncated" => {
                RecorderLine::Truncated(m.reason.unwrap_or_else(|| "no reason given".into()))
            }
            "trace_gpu" => {
                let gpu = m.gpu.ok_or_else(|| needs("gpu"))?;
                RecorderLine::Gpu(gpu.parse().map_err(|_| {
                    format!(
                        "trace_gpu: gpu = {} is not a GPU index (a whole number from 0 to {}, as a string, e.g. \"0\")",
                        quote(&Value::from(gpu.as_str())),
                        u32::MAX
                    )
                })?)
            }
            "trace_end" => {
                RecorderLine::Ended(m.reason.unwrap_or_else(|| "no reason given".into()))
            }
            "trace_resumes" => RecorderLine::Resumes(m.file.ok_or_else(|| needs("file"))?),
            "trace_host" => RecorderLine::Host(m.host.ok_or_else(|| needs("host"))?),
            "trace_peer" => {
                let uid = m.uid.ok_or_else(|| needs("uid"))?;
                let n = uid.as_u64().and_then(|u| u32::try_from(u).ok());
                RecorderLine::Peer(n.ok_or_else(|| {
                    format!(
                        "trace_peer: uid = {} is not a uid (a whole number from 0 to {})",
                        quote(&uid),
                        u32::MAX
                    )
                })?)
            }
            "trace_closed" => RecorderLine::Closed(ts.ok_or_else(|| needs("ts"))?),
            // "trace_nvml": both figures or neither (the daemon had none of the process's own).
            _ => match (used, ts) {
                (Some(used), Some(ts)) => RecorderLine::Nvml(Some(used), Some(ts)),
                _ => RecorderLine::Nvml(None, None),
            },
        })
    }))
}

/// `trace_unified`: both figures or neither, each a byte count, the total at least the free.
fn unified_line(
    free: &Option<serde_json::Value>,
    total: &Option<serde_json::Value>,
) -> Result<RecorderLine, String> {
    let bytes = |name: &str, v: &Option<serde_json::Value>| match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|b| *b <= MAX_BYTES)
            .map(Some)
            .ok_or_else(|| {
                format!(
                "trace_unified: {name} = {} is not a byte count (a whole number from 0 to 2^50)",
                quote(v)
            )
            }),
    };
    Ok(RecorderLine::Unified(
        match (bytes("free_bytes", free)?, bytes("total_bytes", total)?) {
            (Some(free), Some(total)) if free <= total => {
                Some(crate::core::unified::Room { free, total })
            }
            (None, None) => None,
            (free, total) => {
                return Err(format!(
                    "trace_unified: free_bytes {free:?} and total_bytes {total:?} must both be given, the free at most the total"
                ))
            }
        },
    ))
}

/// A recorder line's numbers, each in range, or which is not.
fn recorder(
    kind: &str,
    ts: Option<&serde_json::Value>,
    used: Option<&serde_json::Value>,
) -> Result<(Option<f64>, Option<u64>), String> {
    let ts = match ts {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => match v.as_f64().filter(|t| valid_ts(*t)) {
            Some(t) => Some(t),
            None => {
                return Err(format!(
                    "{kind}: ts = {} is not a Unix time in seconds from 2000 to 2100, as the daemon writes it",
                    quote(v)
                ))
            }
        },
    };
    let used = match used {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => match v.as_u64().filter(|b| *b <= MAX_BYTES) {
            Some(b) => Some(b),
            None => {
                return Err(format!(
                    "{kind}: used_bytes = {} is not a byte count (a whole number from 0 to 2^50)",
                    quote(v)
                ))
            }
        },
    };
    Ok((ts, used))
}

/// A value as JSON writes it (strings quoted and escaped), cut short: it came from a file.
fn quote(v: &serde_json::Value) -> String {
    const MAX: usize = 64;
    let s = v.to_string();
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests;
