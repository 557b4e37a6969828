//! The rule of [`super::escaped`] applied to JSON text, without parsing it: the TUI's snapshots
//! (tens of MiB each second, so no copy of the parsed value) and the JSON gpumon writes for a
//! person's terminal as much as for a program.

use std::borrow::Cow;

use super::escaped;

/// `body`, JSON text, with each escaped character in its strings, raw or written as a JSON
/// escape (`\u001b`, `\n`, a surrogate pair), replaced by the text `\u{1b}` (written `\\u{1b}`
/// in JSON): parsed, every string reads as [`super::printable`] would show it. Anything else,
/// invalid JSON included, is left as it is for the parser to judge. Borrowed, with no copy made,
/// when there is nothing to replace (the usual snapshot); otherwise at most 3.5 times as long
/// (a two-byte C1 control becomes seven bytes).
///
/// Valid JSON holds a backslash, DEL or a non-ASCII character only inside a string, so the scan
/// keeps no state: it stops only at a backslash (whose escape it reads whole, so `\\u001b` is
/// a backslash and text) and at the bytes that can start an escaped character.
pub fn json_strings(body: &[u8]) -> Cow<'_, [u8]> {
    // What is written so far, and up to where `body` is in it: nothing is copied until a
    // character is replaced.
    let mut out = Vec::new();
    let mut done = 0;
    let mut i = 0;
    while i < body.len() {
        let Some(at) = next_stop(&body[i..]) else {
            break;
        };
        i += at;
        let (c, len) = match body[i] {
            b'\\' => json_escape(&body[i..]),
            // serde_json writes DEL raw; the C0 controls are not JSON raw, left to the parser.
            0x7f => (Some('\u{7f}'), 1),
            _ => utf8_char(&body[i..]),
        };
        if let Some(c) = c.filter(|c| escaped(*c)) {
            if out.is_empty() {
                out.reserve(body.len() + 64);
            }
            out.extend_from_slice(&body[done..i]);
            out.extend_from_slice(format!("\\\\u{{{:x}}}", c as u32).as_bytes());
            done = i + len;
        }
        i += len;
    }
    if done == 0 {
        return Cow::Borrowed(body);
    }
    out.extend_from_slice(&body[done..]);
    Cow::Owned(out)
}

/// Where in `s` the scan of [`json_strings`] stops next. A block of 64 bytes is tested at once
/// (vector code), and searched only when one of them is a stop: four times as fast as a search
/// byte by byte over a snapshot with nothing to replace (2 GB/s on a busy 2-core machine).
fn next_stop(s: &[u8]) -> Option<usize> {
    let stop = |b: u8| (b == b'\\') | super::may_start_escaped(b);
    let mut base = 0;
    for block in s.chunks(64) {
        if block.iter().fold(false, |hit, &b| hit | stop(b)) {
            return block.iter().position(|&b| stop(b)).map(|at| base + at);
        }
        base += block.len();
    }
    None
}

/// The character a JSON escape at the start of `s` (which starts with a backslash) stands for,
/// and its length; None for a malformed one or a lone surrogate, copied for the parser to
/// refuse. The length is at least 1 and at most `s.len()`.
fn json_escape(s: &[u8]) -> (Option<char>, usize) {
    let simple = match s.get(1) {
        None => return (None, 1),
        Some(b'u') => None,
        Some(b'b') => Some('\u{8}'),
        Some(b'f') => Some('\u{c}'),
        Some(b'n') => Some('\n'),
        Some(b'r') => Some('\r'),
        Some(b't') => Some('\t'),
        // `\"`, `\\`, `\/` and anything malformed: two bytes that never end the string.
        Some(_) => return (None, 2),
    };
    if simple.is_some() {
        return (simple, 2);
    }
    let Some(hi) = hex4(s.get(2..6)) else {
        return (None, 2);
    };
    if !(0xd800..0xdc00).contains(&hi) {
        return (char::from_u32(hi), 6);
    }
    // A high surrogate: the character is the pair's, when a low one follows.
    let lo = match s.get(6..8) {
        Some(b"\\u") => hex4(s.get(8..12)),
        _ => None,
    };
    match lo {
        Some(lo @ 0xdc00..=0xdfff) => (
            char::from_u32(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)),
            12,
        ),
        _ => (None, 6),
    }
}

fn hex4(s: Option<&[u8]>) -> Option<u32> {
    let s = std::str::from_utf8(s?).ok()?;
    if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

/// The UTF-8 character at the start of `s` and its length; None (length 1) for invalid UTF-8.
fn utf8_char(s: &[u8]) -> (Option<char>, usize) {
    let len = match s[0] {
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => return (None, 1),
    };
    match s.get(..len).map(std::str::from_utf8) {
        Some(Ok(c)) => (c.chars().next(), len),
        _ => (None, 1),
    }
}

/// JSON that serde_json wrote (`s`), with the escaped characters it leaves raw (DEL, C1, the
/// format characters, U+2028...) written as JSON's `\uXXXX`: the same document to a decoder, inert
/// when it is `cat` to a terminal. serde_json escapes C0 itself; outside strings valid JSON
/// holds only ASCII, so each replacement lands inside a string.
pub fn json_ascii(s: &str) -> Cow<'_, str> {
    let bad = |c: char| (c == '\u{7f}' || !c.is_ascii()) && escaped(c);
    if !super::may_hold_escaped(s.as_bytes(), true) || !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if bad(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A log writer for the JSON format: each line tracing writes (one `write` per event) goes out
/// through [`json_ascii`].
#[derive(Clone)]
pub struct JsonAscii<W>(pub W);

impl<W: std::io::Write> std::io::Write for JsonAscii<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(s) => self
                .0
                .write_all(json_ascii(s).as_bytes())
                .map(|()| buf.len()),
            // Not a whole line of text: not one tracing wrote, so passed on as it is.
            Err(_) => self.0.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for JsonAscii<M>
{
    type Writer = JsonAscii<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        JsonAscii(self.0.make_writer())
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
