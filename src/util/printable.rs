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
    escape(s, escaped)
}

/// `s`, a text of several lines that gpumon laid out, with every escaped character but the
/// newline written as `\u{1b}`: the last pass over a report whose fields were escaped by
/// [`printable`] (a second guard, which then finds nothing).
pub fn printable_lines(s: &str) -> Cow<'_, str> {
    escape(s, |c| c != '\n' && escaped(c))
}

fn escape(s: &str, bad: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(&bad) {
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
    let text = serde_json::to_vec(value).ok()?;
    if !json_holds_escaped(&text) {
        return None;
    }
    let mut v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    printable_json(&mut v);
    serde_json::from_value(v).ok()
}

/// Whether JSON text as serde_json writes it holds a character [`escaped`] would escape, in a
/// string or a key. serde_json writes C0 controls as escapes (every escape but `\"` and `\\`
/// is one) and DEL, C1 and the bidirectional controls raw. A backslash in a string reads as
/// `\\`, so it is never taken for an escape; a false yes only costs the copy.
fn json_holds_escaped(text: &[u8]) -> bool {
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'\\' => {
                if !matches!(text.get(i + 1), Some(b'"' | b'\\' | b'/')) {
                    return true;
                }
                i += 2;
                continue;
            }
            0x7f => return true,
            0xc2 if matches!(text.get(i + 1), Some(0x80..=0x9f)) => return true,
            0xe2 if matches!(
                text.get(i + 1..i + 3),
                Some([0x80, 0xaa..=0xae] | [0x81, 0xa6..=0xa9])
            ) =>
            {
                return true
            }
            _ => {}
        }
        i += 1;
    }
    false
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
mod tests {

    #[test]
    fn the_json_scan_sees_exactly_the_escaped_characters() {
        // Every code point up to U+3000 (C0, DEL, C1, the bidi controls and their neighbours),
        // in a value and in a key, beside a backslash and a quote that must not count.
        for c in (0u32..0x3000).filter_map(char::from_u32) {
            let v = serde_json::json!({ format!("k{c}"): "a\\b\"", "v": format!("x{c}y") });
            let text = serde_json::to_vec(&v).unwrap();
            assert_eq!(
                super::json_holds_escaped(&text),
                super::escaped(c),
                "U+{:04X}",
                c as u32
            );
        }
    }

    #[test]
    fn a_value_with_nothing_to_escape_is_not_copied() {
        let clean = serde_json::json!({"job": "train \\ \"x\"", "pid": 7});
        assert!(super::printable_copy(&clean).is_none());
        let dirty = serde_json::json!({"job": "evil\u{1b}[2J\n"});
        let copy = super::printable_copy(&dirty).unwrap();
        assert_eq!(copy["job"], "evil\\u{1b}[2J\\u{a}");
    }

    #[test]
    fn bidi_controls_are_stripped_from_utf8_and_the_json_stays_valid() {
        let v = serde_json::json!({"job": "gro\u{202e}yp.\u{2066}x\u{2069}", "ok": "caf\u{e9} \u{2028}"});
        let mut bytes = serde_json::to_vec(&v).unwrap();
        strip_bidi(&mut bytes);
        let back: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back["job"], "groyp.x");
        assert_eq!(
            back["ok"], "caf\u{e9} \u{2028}",
            "other characters are kept"
        );
        let mut plain = b"{\"a\":\"b\"}".to_vec();
        strip_bidi(&mut plain);
        assert_eq!(plain, b"{\"a\":\"b\"}");
    }

    use super::*;

    #[test]
    fn plain_text_is_borrowed_untouched() {
        for s in ["train.py:27 in f", "ünïcödé ✓ 日本", "C:\\path\\x", ""] {
            assert!(matches!(printable(s), Cow::Borrowed(_)), "{s:?}");
        }
        assert!(matches!(printable_lines("a\nb"), Cow::Borrowed(_)));
    }

    #[test]
    fn c0_del_and_c1_controls_are_escaped() {
        assert_eq!(
            printable("evil\u{1b}[2J\u{1b}]0;pwned\u{7}"),
            "evil\\u{1b}[2J\\u{1b}]0;pwned\\u{7}"
        );
        assert_eq!(printable("a\rb\nc\td\0e"), "a\\u{d}b\\u{a}c\\u{9}d\\u{0}e");
        assert_eq!(printable("x\u{7f}y"), "x\\u{7f}y");
        assert_eq!(printable("\u{9b}2J\u{80}\u{9f}"), "\\u{9b}2J\\u{80}\\u{9f}");
        // Every Cc character, and nothing printable next to it.
        for c in (0u32..0x20).chain(0x7f..0xa0).filter_map(char::from_u32) {
            let out = printable(&c.to_string()).into_owned();
            assert_eq!(out, format!("\\u{{{:x}}}", c as u32));
        }
        assert_eq!(printable("\u{a0}\u{ff}"), "\u{a0}\u{ff}");
    }

    #[test]
    fn bidirectional_controls_are_escaped_and_other_format_characters_kept() {
        assert_eq!(printable("a\u{202e}yp.org"), "a\\u{202e}yp.org");
        for c in ['\u{202a}', '\u{202d}', '\u{2066}', '\u{2069}'] {
            assert!(escaped(c), "{c:?}");
        }
        // The zero-width joiner makes emoji; the marks around the range are ordinary text.
        for c in ['\u{200d}', '\u{2029}', '\u{206a}', '\u{200e}'] {
            assert!(!escaped(c), "{c:?}");
        }
    }

    #[test]
    fn lines_keep_their_newlines_only() {
        assert_eq!(
            printable_lines("a\n\u{1b}[2Jb\r\n"),
            "a\n\\u{1b}[2Jb\\u{d}\n"
        );
    }

    #[test]
    fn the_text_log_escapes_what_a_trainer_wrote() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .fmt_fields(LogFields)
            .finish();
        let job = "evil\u{1b}[2J\u{1b}]0;pwned\u{7}\u{9b}\rFORGED\nFORGED";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(job, message = %job, n = 3, "finding {}", job);
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(out.lines().count(), 1, "{out}");
        let shown = "evil\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\u{9b}\\u{d}FORGED\\u{a}FORGED";
        assert!(out.contains(&format!("finding {shown}")), "{out}");
        // A `%` value is written as is, then escaped; a string's Debug form escapes it already.
        assert!(out.contains(" n=3"), "{out}");
        assert!(out.contains("job=\"evil\\u{1b}[2J"), "{out}");
        assert!(!out.chars().any(|c| c != '\n' && escaped(c)), "{out:?}");
    }

    #[test]
    fn every_string_in_a_document_is_escaped_keys_too() {
        let mut v = serde_json::json!({
            "job": "evil\u{1b}]0;x\u{7}",
            "n": 3,
            "list": ["ok", "a\nb"],
            "map": {"k\u{9b}": {"deep": "\r"}}
        });
        printable_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({
                "job": "evil\\u{1b}]0;x\\u{7}",
                "n": 3,
                "list": ["ok", "a\\u{a}b"],
                "map": {"k\\u{9b}": {"deep": "\\u{d}"}}
            })
        );
    }
}
