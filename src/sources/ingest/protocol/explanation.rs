//! An `oom` event's `explanation` (docs/protocol.md, *event*): what the trainer read in its
//! allocator at the OOM. Checked whole, with the attribution's checks for sites, frames and
//! strings: one value over a limit refuses the line, naming the field and the limit, and the
//! daemon keeps nothing of it.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::attribution::{frame_fields, largest_first, list_of, object, site, stack, string};
use super::{bounded, byte_value, not_a, too_long, Code, Rejection, MAX_LABEL};
use crate::core::detect::attribution::{Frame, MAX_SITES, MAX_STR};
use crate::core::detect::explanation::{Explanation, FailingSite, Pattern, MAX_NOTES};

const AT: &str = "explanation";

pub(super) fn explanation(v: Value) -> Result<Box<Explanation>, Rejection> {
    let mut m = object(AT, v)?;
    let bytes = |m: &mut Map<String, Value>, name: &str| {
        byte_value(&format!("{AT}.{name}"), m.remove(name))
    };
    Ok(Box::new(Explanation {
        pattern: pattern(m.remove("pattern"))?,
        request_bytes: bytes(&mut m, "request_bytes")?,
        limit_bytes: bytes(&mut m, "limit_bytes")?,
        allocated_bytes: bytes(&mut m, "allocated_bytes")?,
        reserved_bytes: bytes(&mut m, "reserved_bytes")?,
        reserved_free_bytes: bytes(&mut m, "reserved_free_bytes")?,
        largest_free_block_bytes: bytes(&mut m, "largest_free_block_bytes")?,
        history: match m.remove("history") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(other) => return Err(not_a(&format!("{AT}.history"), &other, "true or false")),
        },
        failing_site: failing_site(m.remove("failing_site"))?,
        // Largest first, so `top_live` names the largest whatever order the client sent.
        live_sites: largest_first(
            list_of(
                &format!("{AT}.live_sites"),
                m.remove("live_sites"),
                MAX_SITES,
                "a list of sites",
                "(send the largest)",
            )?
            .into_iter()
            .enumerate()
            .map(|(i, s)| site(&format!("{AT}.live_sites[{i}]"), s))
            .collect::<Result<_, _>>()?,
        ),
        reasons: notes("reasons", m.remove("reasons"))?,
        remedies: notes("remedies", m.remove("remedies"))?,
        message: string(AT, "message", m.remove("message"))?.unwrap_or_default(),
    }))
}

/// Required. A pattern this build does not know is `unknown`, as the protocol says; `none`
/// (`explain` on a snapshot without an OOM) is no verdict on an event that is an OOM.
fn pattern(v: Option<Value>) -> Result<Pattern, Rejection> {
    match v {
        None | Some(Value::Null) => Err(Rejection::new(
            Code::BadField,
            format!("{AT} needs \"pattern\" (pressure, fragmentation, leak or unknown)"),
        )),
        Some(Value::String(s)) if s.len() > MAX_LABEL => {
            Err(too_long(&format!("{AT}.pattern"), &s, MAX_LABEL))
        }
        Some(Value::String(s)) => Ok(
            match serde_json::from_value(Value::String(s)).unwrap_or(Pattern::Unknown) {
                Pattern::None => Pattern::Unknown,
                p => p,
            },
        ),
        Some(other) => Err(not_a(&format!("{AT}.pattern"), &other, "a pattern name")),
    }
}

fn failing_site(v: Option<Value>) -> Result<Option<FailingSite>, Rejection> {
    let at = format!("{AT}.failing_site");
    let mut m = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => object(&at, v)?,
    };
    let Frame {
        file,
        line,
        function,
    } = frame_fields(&at, &mut m)?;
    Ok(Some(FailingSite {
        file,
        line,
        function,
        stack: stack(&at, m.remove("stack"))?,
    }))
}

/// `reasons` or `remedies`: at most `MAX_NOTES` strings, each within the string limit.
fn notes(name: &str, v: Option<Value>) -> Result<Vec<String>, Rejection> {
    let field = format!("{AT}.{name}");
    list_of(
        &field,
        v,
        MAX_NOTES,
        "a list of strings",
        "(send the first)",
    )?
    .into_iter()
    .enumerate()
    .map(|(i, s)| match s {
        Value::String(s) => bounded(&format!("{field}[{i}]"), Some(Cow::Owned(s)), MAX_STR)
            .map(Option::unwrap_or_default),
        other => Err(not_a(&format!("{field}[{i}]"), &other, "a string")),
    })
    .collect()
}
