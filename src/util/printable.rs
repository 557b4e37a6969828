//! The one rule for showing a trainer's text to a person: `gpumon status`, `gpumon analyze`'s
//! text, the text log. A trainer names its job, files, functions and errors, and any of those
//! can hold bytes a terminal obeys (clear the screen, retitle the window, rewrite the line).
//!
//! What is escaped, as `\u{…}` (the hex of the code point, the way Rust writes it):
//! - every control character (Unicode category Cc): C0 (U+0000–U+001F, so ESC, BEL, CR, LF and
//!   TAB too), DEL (U+007F) and C1 (U+0080–U+009F, where U+009B is a one-character CSI);
//! - the bidirectional embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069): they
//!   draw no glyph but reorder what follows, so `gro.py` can be shown for `yp.org`
//!   ("Trojan Source", CVE-2021-42574).
//!
//! Everything else is kept, backslashes included: the escape is for a reader, not a decoder,
//! and JSON outputs never go through here (they carry the true string, escaped as JSON).
//! The TUI keeps a rule of its own for the controls: ratatui drops every grapheme that holds a
//! control character when it draws (so a hostile name loses its escapes rather than showing
//! them); the bidirectional controls, which it would draw, are removed from each snapshot it
//! fetches ([`strip_bidi`]).

use std::borrow::Cow;

/// True for a character that is escaped (see the module's list).
pub fn escaped(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` for one line of a terminal: every escaped character written as `\u{1b}`, newlines too,
/// so a job name cannot start a line of its own.
pub fn printable(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// `s`, a text of several lines that gpumon laid out, with every escaped character but the
/// newline written as `\u{1b}`: the last pass over a report whose fields were escaped by
/// [`printable`] (a second guard, which then finds nothing).
pub fn printable_lines(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

fn escape(s: &str, keep_newline: bool) -> Cow<'_, str> {
    let bad = |c: char| !(keep_newline && c == '\n') && escaped(c);
    if !may_hold_escaped(s.as_bytes(), keep_newline) || !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether UTF-8 text may hold a character [`escaped`] escapes (newlines aside when
/// `keep_newline`): each is a byte below 0x20, DEL, or starts with 0xC2 (C1) or 0xE2 (the
/// bidirectional controls), so text with none of those bytes is clean without a look at its
/// characters. A whole report is checked this way, and every string of a snapshot. Clean text
/// is read to its end anyway, so the fold does not stop early: the compiler makes it vector
/// code.
fn may_hold_escaped(text: &[u8], keep_newline: bool) -> bool {
    let newline = if keep_newline { b'\n' } else { 0xff };
    text.iter().fold(false, |hit, &b| {
        hit | ((b < 0x20 && b != newline) | (b == 0x7f) | (b == 0xc2) | (b == 0xe2))
    })
}

/// Removes the bidirectional controls (see [`escaped`]) from UTF-8 text, in place: for the TUI,
/// which draws them as text. Each is three bytes (E2 80 AA–AE, E2 81 A6–A9), so what is left is
/// still UTF-8, and still JSON when the text was (serde_json writes them raw, never as `\u`).
pub fn strip_bidi(text: &mut Vec<u8>) {
    let bidi = |w: &[u8]| matches!(w, [0xe2, 0x80, 0xaa..=0xae] | [0xe2, 0x81, 0xa6..=0xa9]);
    if !text.windows(3).any(bidi) {
        return;
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text.get(i..i + 3).is_some_and(bidi) {
            i += 3;
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    *text = out;
}

/// Every string in a JSON document, map keys included, through [`printable`]: a whole snapshot
/// or report made safe at once, so a string field added later is covered without a word here.
pub fn printable_json(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::String(s) => {
            if let Cow::Owned(o) = printable(s) {
                *s = o;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(printable_json),
        Value::Object(map) => {
            let old = std::mem::take(map);
            for (k, mut item) in old {
                printable_json(&mut item);
                map.insert(printable(&k).into_owned(), item);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// A copy of `value` with every string in it through [`printable`], by way of its JSON form;
/// None when no string in it holds an escaped character (the usual case: `value` is shown as
/// it is, without the copy) or the type does not read back what it writes (then escape the
/// laid-out text instead).
pub fn printable_copy<T>(value: &T) -> Option<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    // The usual answer, found without writing the JSON: a node's snapshot is hundreds of KiB.
    if !holds_escaped(value)? {
        return None;
    }
    let text = serde_json::to_vec(value).ok()?;
    let mut v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    printable_json(&mut v);
    serde_json::from_value(v).ok()
}

/// Whether a string in `value`, a map key included, holds a character [`escaped`] would
/// escape; None when `value` does not serialize. It visits what serde_json would write,
/// writing nothing. Field and variant names come from the types (Rust names, or renames in
/// the source), so only strings and chars from the data are looked at.
fn holds_escaped<T: serde::Serialize + ?Sized>(value: &T) -> Option<bool> {
    match value.serialize(Scan) {
        Ok(()) => Some(false),
        Err(Stop::Found) => Some(true),
        Err(Stop::Failed) => None,
    }
}

/// The serializer behind [`holds_escaped`]: it stops at the first escaped character.
struct Scan;

#[derive(Debug)]
enum Stop {
    Found,
    Failed,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Found => "holds an escaped character",
            Stop::Failed => "does not serialize",
        })
    }
}

impl std::error::Error for Stop {}

impl serde::ser::Error for Stop {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Stop::Failed
    }
}

impl Scan {
    fn text(s: &str) -> Result<(), Stop> {
        if may_hold_escaped(s.as_bytes(), false) && s.chars().any(escaped) {
            Err(Stop::Found)
        } else {
            Ok(())
        }
    }
}

impl serde::Serializer for Scan {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = Scan;
    type SerializeTuple = Scan;
    type SerializeTupleStruct = Scan;
    type SerializeTupleVariant = Scan;
    type SerializeMap = Scan;
    type SerializeStruct = Scan;
    type SerializeStructVariant = Scan;

    fn serialize_bool(self, _: bool) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_i8(self, _: i8) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_i16(self, _: i16) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_i32(self, _: i32) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_i64(self, _: i64) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_i128(self, _: i128) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_u8(self, _: u8) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_u16(self, _: u16) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_u32(self, _: u32) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_u64(self, _: u64) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_u128(self, _: u128) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_f32(self, _: f32) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_f64(self, _: f64) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_char(self, c: char) -> Result<(), Stop> {
        if escaped(c) {
            Err(Stop::Found)
        } else {
            Ok(())
        }
    }
    fn serialize_str(self, s: &str) -> Result<(), Stop> {
        Scan::text(s)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), Stop> {
        // JSON writes bytes as an array of numbers.
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_some<T: serde::Serialize + ?Sized>(self, v: &T) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn serialize_unit(self) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), Stop> {
        Ok(())
    }
    fn serialize_newtype_struct<T: serde::Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn serialize_newtype_variant<T: serde::Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        v: &T,
    ) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Scan, Stop> {
        Ok(Scan)
    }
    fn serialize_tuple(self, _: usize) -> Result<Scan, Stop> {
        Ok(Scan)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Scan, Stop> {
        Ok(Scan)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Scan, Stop> {
        Ok(Scan)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Scan, Stop> {
        Ok(Scan)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Scan, Stop> {
        Ok(Scan)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Scan, Stop> {
        Ok(Scan)
    }
}

impl serde::ser::SerializeSeq for Scan {
    type Ok = ();
    type Error = Stop;
    fn serialize_element<T: serde::Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn end(self) -> Result<(), Stop> {
        Ok(())
    }
}

impl serde::ser::SerializeTuple for Scan {
    type Ok = ();
    type Error = Stop;
    fn serialize_element<T: serde::Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn end(self) -> Result<(), Stop> {
        Ok(())
    }
}

impl serde::ser::SerializeTupleStruct for Scan {
    type Ok = ();
    type Error = Stop;
    fn serialize_field<T: serde::Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn end(self) -> Result<(), Stop> {
        Ok(())
    }
}

impl serde::ser::SerializeTupleVariant for Scan {
    type Ok = ();
    type Error = Stop;
    fn serialize_field<T: serde::Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn end(self) -> Result<(), Stop> {
        Ok(())
    }
}

impl serde::ser::SerializeMap for Scan {
    type Ok = ();
    type Error = Stop;
    fn serialize_key<T: serde::Serialize + ?Sized>(&mut self, k: &T) -> Result<(), Stop> {
        k.serialize(Scan)
    }
    fn serialize_value<T: serde::Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn end(self) -> Result<(), Stop> {
        Ok(())
    }
}

impl serde::ser::SerializeStruct for Scan {
    type Ok = ();
    type Error = Stop;
    fn serialize_field<T: serde::Serialize + ?Sized>(
        &mut self,
        _: &'static str,
        v: &T,
    ) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn end(self) -> Result<(), Stop> {
        Ok(())
    }
}

impl serde::ser::SerializeStructVariant for Scan {
    type Ok = ();
    type Error = Stop;
    fn serialize_field<T: serde::Serialize + ?Sized>(
        &mut self,
        _: &'static str,
        v: &T,
    ) -> Result<(), Stop> {
        v.serialize(Scan)
    }
    fn end(self) -> Result<(), Stop> {
        Ok(())
    }
}

/// Field formatting for the text log: `message key=value ...` as tracing-subscriber writes it,
/// every value through [`printable`]. Its own guard escapes ESC, BEL and C1 but passes CR, LF
/// and TAB in `%` values, so a trainer's string could forge a log line; and one rule reads the
/// same in the log as on `gpumon status`. The JSON log keeps true values (escaped as JSON).
pub struct LogFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for LogFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = LogVisitor(String::new());
        fields.record(&mut visitor);
        writer.write_str(&printable(&visitor.0))
    }
}

struct LogVisitor(String);

impl tracing::field::Visit for LogVisitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        if !self.0.is_empty() {
            self.0.push(' ');
        }
        let name = field.name();
        let _ = match name {
            "message" => write!(self.0, "{value:?}"),
            _ => write!(self.0, "{}={value:?}", name.trim_start_matches("r#")),
        };
    }
}

#[cfg(test)]
mod tests;
