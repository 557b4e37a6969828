//! The `attribution` message: a trainer's answer to an `attribute` request. Checked whole before
//! anything is kept: counts bounded like every byte field, strings, sites and stacks within the
//! limits of `detect::attribution`. One bad value refuses the message, naming the field and the
//! limit; the daemon's state is untouched by it.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::{bounded, byte_value, not_a, required, ts, Code, Raw, Rejection, MAX_BYTES};
use crate::core::detect::attribution::{Attribution, Frame, Site, MAX_SITES, MAX_STACK, MAX_STR};

/// Longest `error` kind (`unavailable`, `failed`, `cut_short`, or one a later client adds).
pub(super) const MAX_ERROR: usize = 32;
/// A window longer than this (about four months) is no measurement.
const MAX_SECONDS: f64 = 1e7;
/// Largest line number taken.
const MAX_LINE_NO: u64 = u32::MAX as u64;

pub(super) fn attribution(r: Raw) -> Result<Attribution, Rejection> {
    let seconds = match r.seconds {
        Some(s) if !(s.is_finite() && (0.0..=MAX_SECONDS).contains(&s)) => {
            return Err(Rejection::new(
                Code::BadField,
                format!("seconds = {s} is not a window length (0 to {MAX_SECONDS} seconds)"),
            ))
        }
        other => other,
    };
    window(r.step_from, r.step_to)?;
    Ok(Attribution {
        id: required("attribution", "id", r.id)?,
        ts: ts("ts", required("attribution", "ts", r.ts)?)?,
        // The daemon names the finding from its own request, never from the client.
        finding: None,
        step_from: r.step_from,
        step_to: r.step_to,
        seconds,
        total_growth_bytes: byte_value("total_growth_bytes", r.total_growth_bytes)?.unwrap_or(0),
        sites: sites(r.sites)?,
        error: bounded("error", r.error, MAX_ERROR)?,
        detail: bounded("detail", r.detail, MAX_STR)?,
    })
}

/// A step window (`attribution`, `peak`): one that ends before it starts would be shown as no
/// window at all, and what was measured over it can only be a mix-up of the two: refused
/// rather than guessed at.
pub(super) fn window(from: Option<u64>, to: Option<u64>) -> Result<(), Rejection> {
    match (from, to) {
        (Some(from), Some(to)) if from > to => Err(Rejection::new(
            Code::BadField,
            format!(
                "step_from = {from} is after step_to = {to}: the window runs from step_from to step_to (send the earlier step as step_from)"
            ),
        )),
        _ => Ok(()),
    }
}

pub(super) fn sites(v: Option<Value>) -> Result<Vec<Site>, Rejection> {
    list_of(
        "sites",
        v,
        MAX_SITES,
        "a list of sites",
        "(send the largest)",
    )?
    .into_iter()
    .enumerate()
    .map(|(i, s)| site(&format!("sites[{i}]"), s))
    .collect()
}

/// Sites largest first (bytes descending; equals keep the order sent): what names the top site
/// (`Peak::top`, `Explanation::top_live`) takes the first, whatever order the client sent.
pub(super) fn largest_first(mut sites: Vec<Site>) -> Vec<Site> {
    sites.sort_by_key(|s| std::cmp::Reverse(s.bytes));
    sites
}

/// A list field of at most `max` entries (absent or null: none); over the limit, or not a
/// list, a `bad_field` naming `field` and the limit.
pub(super) fn list_of(
    field: &str,
    v: Option<Value>,
    max: usize,
    what: &str,
    advice: &str,
) -> Result<Vec<Value>, Rejection> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => return Err(not_a(field, &other, what)),
    };
    if list.len() > max {
        return Err(Rejection::new(
            Code::BadField,
            format!(
                "{field} has {} entries; at most {max} are accepted {advice}",
                list.len()
            ),
        ));
    }
    Ok(list)
}

pub(super) fn site(at: &str, v: Value) -> Result<Site, Rejection> {
    let mut m = object(at, v)?;
    let Frame {
        file,
        line,
        function,
    } = frame_fields(at, &mut m)?;
    let stack = stack(at, m.remove("stack"))?;
    Ok(Site {
        file,
        line,
        function,
        bytes: count(at, "bytes", m.remove("bytes"))?.ok_or_else(|| missing(at, "bytes"))?,
        blocks: count(at, "blocks", m.remove("blocks"))?.unwrap_or(0),
        stack,
        note: string(at, "note", m.remove("note"))?,
    })
}

/// `<at>.stack`: at most `MAX_STACK` frames, innermost first.
pub(super) fn stack(at: &str, v: Option<Value>) -> Result<Vec<Frame>, Rejection> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(frames)) if frames.len() > MAX_STACK => Err(Rejection::new(
            Code::BadField,
            format!(
                "{at}.stack has {} frames; at most {MAX_STACK} are accepted (keep the innermost)",
                frames.len()
            ),
        )),
        Some(Value::Array(frames)) => frames
            .into_iter()
            .enumerate()
            .map(|(j, f)| frame(&format!("{at}.stack[{j}]"), f))
            .collect(),
        Some(other) => Err(not_a(&format!("{at}.stack"), &other, "a list of frames")),
    }
}

fn frame(at: &str, v: Value) -> Result<Frame, Rejection> {
    frame_fields(at, &mut object(at, v)?)
}

/// `file` and `line` (required) and `function` (empty when absent) of a site or a frame.
pub(super) fn frame_fields(at: &str, m: &mut Map<String, Value>) -> Result<Frame, Rejection> {
    let line = match m.remove("line") {
        None | Some(Value::Null) => return Err(missing(at, "line")),
        Some(v) => match v.as_u64().filter(|l| *l <= MAX_LINE_NO) {
            Some(l) => l,
            None => {
                return Err(not_a(
                    &format!("{at}.line"),
                    &v,
                    "a line number (an integer from 0 to 2^32-1)",
                ))
            }
        },
    };
    Ok(Frame {
        file: string(at, "file", m.remove("file"))?.ok_or_else(|| missing(at, "file"))?,
        line,
        function: string(at, "function", m.remove("function"))?.unwrap_or_default(),
    })
}

pub(super) fn object(at: &str, v: Value) -> Result<Map<String, Value>, Rejection> {
    match v {
        Value::Object(m) => Ok(m),
        other => Err(not_a(at, &other, "an object")),
    }
}

pub(super) fn string(at: &str, name: &str, v: Option<Value>) -> Result<Option<String>, Rejection> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => bounded(&format!("{at}.{name}"), Some(Cow::Owned(s)), MAX_STR),
        Some(other) => Err(not_a(&format!("{at}.{name}"), &other, "a string")),
    }
}

/// A byte or block count: an integer from 0 to 2^50, like every byte field of the protocol.
fn count(at: &str, name: &str, v: Option<Value>) -> Result<Option<u64>, Rejection> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().filter(|b| *b <= MAX_BYTES) {
            Some(b) => Ok(Some(b)),
            None => Err(not_a(
                &format!("{at}.{name}"),
                &v,
                "a count (an integer from 0 to 2^50)",
            )),
        },
    }
}

fn missing(at: &str, name: &str) -> Rejection {
    Rejection::new(Code::BadField, format!("{at} needs \"{name}\""))
}

#[cfg(test)]
mod tests;
