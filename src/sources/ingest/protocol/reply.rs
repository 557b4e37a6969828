//! Daemon → trainer lines: `welcome`, `ack`, `error` and the requests.

use serde::{Serialize, Serializer};

use super::Code;

/// Daemon → trainer lines.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply<'a> {
    Welcome {
        v: u64,
        server: &'a str,
        session: &'a str,
        /// The connection's line rate limit, so the client can pace itself under it; left out
        /// where there is none (an offline replay).
        #[serde(skip_serializing_if = "Option::is_none")]
        max_lines_per_second: Option<u32>,
        /// True when the hello listed `ack`: this daemon acknowledges numbered lines.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        ack: bool,
    },
    /// Every line numbered up to `seq` was taken (applied, and written to the trace when the
    /// session is recorded) or refused with its own error reply: the client may forget them.
    Ack { seq: u64 },
    Error {
        code: Code,
        line: u64,
        message: &'a str,
    },
    /// A request (docs/protocol.md, *Requests from the daemon*), sent only to a client whose
    /// hello listed `attribution`: record allocation history for a window and say where the
    /// memory of finding `finding` is allocated.
    Attribute {
        v: u64,
        id: u64,
        finding: &'a str,
        steps: u64,
        #[serde(serialize_with = "whole_as_integer")]
        seconds: f64,
        max_entries: u64,
        top: u64,
    },
    /// A request to a client whose hello listed `oom_history`: keep allocation history
    /// recording for up to `seconds` while an OOM is likely (for finding `finding`), and after
    /// `peak_after_steps` steps (when not 0) report what is live at the step peak.
    Arm {
        v: u64,
        id: u64,
        finding: &'a str,
        #[serde(serialize_with = "whole_as_integer")]
        seconds: f64,
        max_entries: u64,
        peak_after_steps: u64,
    },
    /// The risk has passed: stop the recording arm request `id` started.
    Disarm { v: u64, id: u64 },
}

/// `120` rather than `120.0` for whole seconds, as the protocol's example writes it.
fn whole_as_integer<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(v) {
        s.serialize_u64(*v as u64)
    } else {
        s.serialize_f64(*v)
    }
}

impl Reply<'_> {
    /// The reply as one line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(self).unwrap_or_default();
        out.push(b'\n');
        out
    }
}
