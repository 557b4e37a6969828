#[test]
fn the_scan_sees_exactly_the_escaped_characters() {
    // Every code point up to U+3000 (C0, DEL, C1, the bidi controls and their neighbours),
    // in a value, in a key, as a char and deep in a document, beside a backslash and a
    // quote that must not count; and the quick byte test never misses one.
    for c in (0u32..0x3000).filter_map(char::from_u32) {
        let want = super::escaped(c);
        let docs = [
            serde_json::json!({ format!("k{c}"): "a\\b\"", "v": 1 }),
            serde_json::json!({ "k": "a\\b\"", "v": format!("x{c}y") }),
            serde_json::json!([1, {"deep": [null, format!("{c}")]}]),
        ];
        for doc in &docs {
            assert_eq!(super::holds_escaped(doc), Some(want), "U+{:04X}", c as u32);
        }
        assert_eq!(super::holds_escaped(&c), Some(want), "U+{:04X}", c as u32);
        assert_eq!(super::holds_escaped(&(7u8, Some(c))), Some(want));
        let text = format!("ab{c}");
        if want {
            assert!(
                super::may_hold_escaped(text.as_bytes(), false),
                "U+{:04X}",
                c as u32
            );
            assert_eq!(super::may_hold_escaped(text.as_bytes(), true), c != '\n');
        }
    }
    // Across the blocks of the byte test, at each place.
    for at in 0..200 {
        let mut text = "x".repeat(200);
        text.insert(at, '\u{1b}');
        assert!(matches!(printable(&text), Cow::Owned(_)), "{at}");
        let clean = "y".repeat(at) + "\n";
        assert!(matches!(printable_lines(&clean), Cow::Borrowed(_)), "{at}");
    }
}

#[test]
fn a_map_key_a_variant_and_a_failing_value_are_scanned_as_json_writes_them() {
    use std::collections::BTreeMap;
    #[derive(serde::Serialize)]
    enum E {
        Unit,
        Tuple(String, u8),
        Struct { s: String },
    }
    let keys: BTreeMap<String, u8> = [("a\u{9b}".to_string(), 1)].into();
    assert_eq!(super::holds_escaped(&keys), Some(true));
    assert_eq!(super::holds_escaped(&E::Unit), Some(false));
    assert_eq!(super::holds_escaped(&E::Tuple("\r".into(), 1)), Some(true));
    assert_eq!(
        super::holds_escaped(&E::Struct { s: "ok".into() }),
        Some(false)
    );
    assert_eq!(
        super::holds_escaped(&E::Struct {
            s: "\u{2066}".into()
        }),
        Some(true)
    );
    struct Fails;
    impl serde::Serialize for Fails {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }
    assert_eq!(super::holds_escaped(&Fails), None);
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
    let v =
        serde_json::json!({"job": "gro\u{202e}yp.\u{2066}x\u{2069}", "ok": "caf\u{e9} \u{2028}"});
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
