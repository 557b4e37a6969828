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
fn bidirectional_and_invisible_characters_are_escaped_and_visible_ones_kept() {
    assert_eq!(printable("a\u{202e}yp.org"), "a\\u{202e}yp.org");
    assert_eq!(printable("a\u{200b}b\u{feff}"), "a\\u{200b}b\\u{feff}");
    assert_eq!(printable("tag\u{e0041}"), "tag\\u{e0041}");
    for c in [
        '\u{202a}',
        '\u{202d}',
        '\u{2066}',
        '\u{2069}',
        '\u{200e}',
        '\u{200f}',
        '\u{61c}',
        '\u{2028}',
        '\u{2029}',
        '\u{200b}',
        '\u{200d}',
        '\u{feff}',
        '\u{2060}',
        '\u{2064}',
        '\u{180e}',
        '\u{ad}',
        '\u{34f}',
        '\u{3164}',
        '\u{fe0f}',
        '\u{e0001}',
        '\u{e01ef}',
    ] {
        assert!(escaped(c), "U+{:04X}", c as u32);
    }
    // Their neighbours, combining marks and wide characters are text.
    for c in [
        '\u{ac}',
        '\u{ae}',
        '\u{200a}',
        '\u{2010}',
        '\u{2027}',
        '\u{202f}',
        '\u{205f}',
        '\u{2070}',
        '\u{301}',
        '\u{e9}',
        '\u{65e5}',
        '\u{1f600}',
        '\u{fffd}',
        '\u{e1000}',
    ] {
        assert!(!escaped(c), "U+{:04X}", c as u32);
    }
}

/// The escaped set is what the module's doc lists: every Cc, Cf, Zl and Zp character, and the
/// other default-ignorable code points, over all of Unicode; and the quick byte test never
/// misses one.
#[test]
fn the_escaped_set_is_the_documented_one_over_all_of_unicode() {
    let listed = |c: u32| {
        matches!(c,
            0..=0x1f | 0x7f..=0x9f
            // Cf (Unicode 15.1).
            | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x180e
            | 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff
            | 0xfff9..=0xfffb | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3
            | 0x1d173..=0x1d17a | 0xe0001 | 0xe0020..=0xe007f
            // Zl, Zp.
            | 0x2028 | 0x2029
            // Default_Ignorable_Code_Point beyond Cf.
            | 0x34f | 0x115f..=0x1160 | 0x17b4..=0x17b5 | 0x180b..=0x180d | 0x180f | 0x2065
            | 0x3164 | 0xfe00..=0xfe0f | 0xffa0 | 0xfff0..=0xfff8 | 0xe0000..=0xe0fff)
    };
    let mut n = 0;
    for c in (0..=0x10ffffu32).filter_map(char::from_u32) {
        assert_eq!(escaped(c), listed(c as u32), "U+{:04X}", c as u32);
        if escaped(c) {
            n += 1;
            let text = format!("ab{c}cd");
            assert!(
                may_hold_escaped(text.as_bytes(), false),
                "U+{:04X}",
                c as u32
            );
            assert!(matches!(printable(&text), Cow::Owned(_)));
        }
    }
    // 65 Cc, 170 Cf, U+2028, U+2029, and the default-ignorables outside Cf.
    assert_eq!(n, 4273, "the size of the set");
}

#[path = "../../../tests/common/hostile.rs"]
pub(super) mod hostile;

/// The shared corpus: escaped, each reads as one line of visible text, and escaping is
/// idempotent (the TUI's strings are escaped on arrival and again where a screen lays them).
#[test]
fn the_hostile_corpus_leaves_nothing_a_terminal_obeys() {
    for s in hostile::HOSTILE {
        let shown = printable(s);
        assert!(!shown.chars().any(escaped), "{s:?} -> {shown:?}");
        assert!(
            shown.chars().all(|c| !c.is_whitespace() || c == ' '),
            "{shown:?}"
        );
        assert_eq!(printable(&shown), shown, "idempotent");
        assert!(hostile::first_escape(&shown).len() <= 12, "{shown}");
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

#[test]
fn the_scan_stops_only_at_the_start_of_a_character() {
    // json_strings skips to these bytes: never a continuation byte, never ASCII but DEL.
    for b in (0u8..0x7f).chain(0x80..0xc0) {
        assert!(!may_start_escaped(b), "{b:#x}");
    }
}
