//! The one rule for showing text to a person: `gpumon status`, `gpumon analyze`'s text, the
//! TUI, the text log, and every error `main` prints. A trainer names its job, files, functions
//! and errors, a daemon (or whatever answers on its port) sends snapshots and error texts, and
//! any of those can hold characters a terminal obeys (clear the screen, retitle the window,
//! write the clipboard, rewrite the line) or draws as nothing.
//!
//! What is escaped, as `\u{…}` (the hex of the code point, the way Rust writes it):
//! - every control character (Unicode category Cc): C0 (U+0000–U+001F, so ESC, BEL, CR, LF and
//!   TAB too), DEL (U+007F) and C1 (U+0080–U+009F, where U+009B is a one-character CSI);
//! - every format character (category Cf, as of Unicode 15.1): the bidirectional marks,
//!   embeddings, overrides and isolates (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069),
//!   which draw no glyph but reorder what follows, so `gro.py` can be shown for `yp.org`
//!   ("Trojan Source", CVE-2021-42574); the zero-width and invisible ones (U+00AD soft hyphen,
//!   U+180E, U+200B–U+200D, U+2060–U+2064, U+206A–U+206F, U+FEFF), which hide text in plain
//!   sight and make a terminal and gpumon count columns differently; the tags (U+E0001,
//!   U+E0020–U+E007F), invisible ASCII; and the rest (U+0600–U+0605, U+06DD, U+070F,
//!   U+0890–U+0891, U+08E2, U+FFF9–U+FFFB, U+110BD, U+110CD, U+13430–U+1343F,
//!   U+1BCA0–U+1BCA3, U+1D173–U+1D17A), which join or hide what is next to them;
//! - the line and paragraph separators (U+2028, U+2029: categories Zl, Zp), which some
//!   terminals and editors take for a newline;
//! - the other default-ignorable code points, which fonts draw as nothing: U+034F, the Hangul
//!   fillers (U+115F, U+1160, U+3164, U+FFA0), U+17B4–U+17B5, the variation selectors
//!   (U+180B–U+180D, U+180F, U+FE00–U+FE0F, U+E0100–U+E01EF: an emoji's U+FE0F is one a
//!   terminal may draw one column wide or two), and those unassigned yet (U+2065, U+FFF0–U+FFF8,
//!   the rest of U+E0000–U+E0FFF).
//!
//! The cost: an emoji joined by U+200D, or one asking for colour by U+FE0F, shows its parts
//! with the joiner as `\u{200d}`; a Persian word with U+200C shows it. Honest columns are
//! worth it in a monitor's table. Combining marks and wide characters are drawn as they are.
//!
//! Everything else is kept, backslashes included: the escape is for a reader, not a decoder.
//! The JSON outputs (`status --json`, `analyze --format json`, the JSON log) carry the true
//! string, with these characters written as JSON's `\uXXXX` ([`json_ascii`]): still the same
//! string to a decoder, and inert when the file is `cat` to a terminal.
//! The TUI reads a daemon's snapshot through [`json_strings`], which writes every string's
//! escaped characters as `\u{…}` text before it is parsed: so ratatui, which would drop a
//! grapheme holding a control character and draw the rest of the escape sequence, and
//! measures widths by its own tables, only ever sees what this rule leaves.

use std::borrow::Cow;

mod json;

pub use json::{json_ascii, json_strings, JsonAscii};

/// True for a character that is escaped (see the module's list).
pub fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{34f}'
                | '\u{600}'..='\u{605}'
                | '\u{61c}'
                | '\u{6dd}'
                | '\u{70f}'
                | '\u{890}'..='\u{891}'
                | '\u{8e2}'
                | '\u{115f}'..='\u{1160}'
                | '\u{17b4}'..='\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{fff0}'..='\u{fffb}'
                | '\u{110bd}'
                | '\u{110cd}'
                | '\u{13430}'..='\u{1343f}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0000}'..='\u{e0fff}'
        )
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
/// `keep_newline`): each is a byte below 0x20, DEL, or starts with one of the lead bytes
/// below (C2 for C1 and U+00AD, E2 for U+2000–U+2FFF, F3 for the tags...), so text with none
/// of those bytes is clean without a look at its characters. A whole report is checked this
/// way, and every string of a snapshot. Clean text is read to its end anyway, so the fold
/// does not stop early: the compiler makes it vector code.
fn may_hold_escaped(text: &[u8], keep_newline: bool) -> bool {
    let newline = if keep_newline { b'\n' } else { 0xff };
    text.iter().fold(false, |hit, &b| {
        hit | ((b < 0x20 && b != newline) | may_start_escaped(b))
    })
}

/// Whether `b` is DEL or a UTF-8 lead byte that starts some escaped character: the test of
/// [`may_hold_escaped`] beyond C0. Never a continuation byte (0x80–0xBF), so text scanned for
/// these bytes is stopped only at the start of a character.
fn may_start_escaped(b: u8) -> bool {
    (b == 0x7f)
        // U+0080–U+00BF; U+0340–U+037F; U+0600–U+06FF; U+0700–U+073F.
        | (b == 0xc2)
        | (b == 0xcd)
        | (b == 0xd8)
        | (b == 0xdb)
        | (b == 0xdc)
        // U+0800–U+3FFF: 0890, 08E2, 115F, 17B4, 180B, 200B..., 3164.
        | (0xe0..=0xe3).contains(&b)
        // U+F000–U+FFFF; U+10000–U+3FFFF; U+C0000–U+FFFFF.
        | (b == 0xef)
        | (b == 0xf0)
        | (b == 0xf3)
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
