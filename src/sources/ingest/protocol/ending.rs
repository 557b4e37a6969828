//! An event's `ending`: how the trainer's process says it is ending, short of a clean `bye`
//! (protocol.md, *Endings*). A value this build does not know is ignored, as an unknown field
//! would be, so a newer client's endings are no error.

use std::borrow::Cow;

use super::{label, Code, Rejection};
use crate::core::trainer::{Exit, DIED_PREFIX};

/// Longest exception text kept (type and message): it is shown, not parsed.
pub const MAX_EXCEPTION: usize = 512;

pub fn ending(
    ending: Option<Cow<str>>,
    signal: Option<Cow<str>>,
    exception: Option<Cow<str>>,
    detail: Option<&str>,
) -> Result<Option<Exit>, Rejection> {
    let Some(how) = label("ending", ending)? else {
        return Ok(None);
    };
    match how.as_str() {
        "signal" => {
            let name = label("signal", signal)?.filter(|s| !s.is_empty());
            let name = name.ok_or_else(|| {
                Rejection::new(
                    Code::BadField,
                    "an ending \"signal\" needs \"signal\" (its name, e.g. \"SIGTERM\")",
                )
            })?;
            Ok(Some(Exit::Signal(name)))
        }
        "exception" => {
            let ty = label("exception", exception)?.filter(|s| !s.is_empty());
            let ty = ty.ok_or_else(|| {
                Rejection::new(
                    Code::BadField,
                    "an ending \"exception\" needs \"exception\" (its type, e.g. \"RuntimeError\")",
                )
            })?;
            let said = detail.map(|d| d.strip_prefix(DIED_PREFIX).unwrap_or(d));
            let text = match said {
                Some(d) if d.starts_with(ty.as_str()) => d.to_string(),
                Some(d) if !d.is_empty() => format!("{ty}: {d}"),
                _ => ty,
            };
            Ok(Some(Exit::Exception(clip(text, MAX_EXCEPTION))))
        }
        // Unknown to this build: kept out of the verdict, never an error.
        _ => Ok(None),
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}
