use std::borrow::Cow;

use super::*;
use crate::util::printable::printable;

use crate::util::printable::tests::hostile;

/// `v`'s JSON through [`json_strings`], parsed back.
fn through(text: &[u8]) -> serde_json::Value {
    serde_json::from_slice(&json_strings(text)).unwrap()
}

#[test]
fn every_string_of_a_document_reads_as_printable_would_show_it() {
    for s in hostile::HOSTILE {
        let doc = serde_json::json!({ *s: [s, {"deep": s}], "n": 1.5, "ok": "caf\u{e9} \u{65e5}" });
        for text in [
            serde_json::to_vec(&doc).unwrap(),
            serde_json::to_vec_pretty(&doc).unwrap(),
        ] {
            let shown = printable(s).into_owned();
            let want = serde_json::json!({ &shown: [&shown, {"deep": &shown}], "n": 1.5,
                "ok": "caf\u{e9} \u{65e5}" });
            assert_eq!(through(&text), want, "{s:?}");
        }
    }
}

#[test]
fn json_escapes_are_read_as_the_characters_they_stand_for() {
    // Written by hand as a server may: upper-case hex, every short escape, a surrogate pair
    // for a tag and one for an emoji that is kept.
    let text = br#"{"a":"x\u001B[2J\n\t\r\b\f","b":"\uDB40\uDC41\ud83d\ude00","c":"\u202E\u00e9"}"#;
    assert_eq!(
        through(text),
        serde_json::json!({"a": "x\\u{1b}[2J\\u{a}\\u{9}\\u{d}\\u{8}\\u{c}",
            "b": "\\u{e0041}\u{1f600}", "c": "\\u{202e}\u{e9}"})
    );
}

#[test]
fn what_is_not_an_escaped_character_is_left_alone() {
    // A backslash before `u001b` is an escaped backslash, not an escape; quotes inside strings
    // do not end them; text outside strings (keys aside) is never touched.
    let text = br#"{"a":"\\u001b \" \/ \\","n":[1,2e3,null,true]}"#;
    assert!(matches!(json_strings(text), Cow::Borrowed(_)));
    assert_eq!(
        through(text),
        serde_json::json!({"a": "\\u001b \" / \\", "n": [1, 2e3, null, true]})
    );
    let clean = serde_json::to_vec(&serde_json::json!({"job": "caf\u{e9} \u{65e5}\u{1f600}"}));
    assert!(matches!(json_strings(&clean.unwrap()), Cow::Borrowed(_)));
}

#[test]
fn malformed_json_stays_malformed_and_nothing_panics() {
    for bad in [
        &b"\"\\"[..],
        b"\"\\u12",
        b"\"\\uzzzz\"",
        b"\"\\ud800\"",
        b"\"\\ud800\\u0041\"",
        b"\"\xff\xfe\"",
        b"\"\xe2\x80\"",
        b"\"\x1b\"",
        b"\"\xf3\xa0\x81",
    ] {
        let out = json_strings(bad);
        assert!(
            serde_json::from_slice::<serde_json::Value>(&out).is_err(),
            "{:?} -> {:?}",
            String::from_utf8_lossy(bad),
            String::from_utf8_lossy(&out)
        );
    }
}

#[test]
fn json_ascii_keeps_the_document_and_leaves_nothing_raw() {
    for s in hostile::HOSTILE {
        let doc = serde_json::json!({"job": s, *s: 1});
        for text in [
            serde_json::to_string(&doc).unwrap(),
            serde_json::to_string_pretty(&doc).unwrap(),
        ] {
            let out = json_ascii(&text);
            assert!(
                !out.chars().any(|c| c != '\n' && escaped(c)),
                "{s:?} -> {out:?}"
            );
            let back: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(back, doc, "the same document");
        }
    }
    let plain = "{\"job\":\"caf\u{e9}\"}";
    assert!(matches!(json_ascii(plain), Cow::Borrowed(_)));
}

#[test]
fn the_json_log_writer_passes_each_line_through_json_ascii() {
    use std::io::Write as _;
    let mut w = JsonAscii(Vec::new());
    let line = "{\"job\":\"a\u{202e}b\u{9b}\"}\n";
    assert_eq!(w.write(line.as_bytes()).unwrap(), line.len());
    assert_eq!(
        String::from_utf8(w.0).unwrap(),
        "{\"job\":\"a\\u202eb\\u009b\"}\n"
    );
}

#[test]
fn an_escaped_character_is_found_at_any_place_in_the_blocks_scanned() {
    for at in 0..200 {
        for c in ["\u{200b}", "\\u001b", "\u{9b}", "\u{7f}", "\\n"] {
            let text = format!("{{\"a\":\"{}{c}{}\"}}", "x".repeat(at), "y".repeat(at % 7));
            let v = through(text.as_bytes());
            let s = v["a"].as_str().unwrap();
            assert!(s.starts_with(&"x".repeat(at)), "{at} {c}");
            assert!(
                !s.chars().any(escaped) && s.contains("\\u{"),
                "{at} {c}: {s}"
            );
        }
    }
}
