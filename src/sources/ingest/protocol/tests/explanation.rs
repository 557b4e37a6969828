//! The `explanation` of an `oom` event: read as the contract writes it, refused whole (naming
//! the field and the limit) when over a limit or of the wrong type.

use serde_json::{json, Value};

use super::*;
use crate::core::detect::attribution::{MAX_SITES, MAX_STACK, MAX_STR};
use crate::core::detect::explanation::{Pattern, MAX_NOTES};

const FRAGMENTATION: &str = include_str!("../../../../../tests/fixtures/oom/fragmentation.json");

/// An oom event carrying the real fixture's explanation, changed by `edit`.
fn oom_with(edit: impl FnOnce(&mut Value)) -> String {
    let mut x: Value = serde_json::from_str(FRAGMENTATION).unwrap();
    edit(&mut x);
    json!({"type": "event", "ts": 1763700400.0, "kind": "oom", "alloc_bytes": 1610612736u64,
           "alloc_limit": 4294967296u64, "explanation": x})
    .to_string()
}

fn refused(line: &str) -> Rejection {
    parse(line.as_bytes()).unwrap_err()
}

#[test]
fn the_real_fragmentation_explanation_is_read_whole() {
    let Message::Event(e) = parse(oom_with(|_| {}).as_bytes()).unwrap() else {
        panic!()
    };
    let x = e.explanation.expect("kept");
    assert_eq!(x.pattern, Pattern::Fragmentation);
    assert_eq!(x.request_bytes, Some(1_610_612_736));
    assert_eq!(x.limit_bytes, Some(4_294_967_296));
    assert_eq!(x.reserved_free_bytes, Some(2_454_716_416));
    assert_eq!(x.largest_free_block_bytes, Some(13_631_488));
    assert!(x.history);
    let f = x.failing_site.as_ref().unwrap();
    assert_eq!(
        (f.short().as_str(), f.function.as_str()),
        ("oomlib.py:37", "dev_big")
    );
    assert_eq!(f.stack.len(), 2);
    assert_eq!(f.stack[1].function, "fragmentation");
    let top = x.top_live().unwrap();
    assert_eq!(
        (top.short().as_str(), top.bytes, top.blocks),
        ("oomlib.py:32", 1_321_205_760, 180)
    );
    assert_eq!(x.reasons.len(), 1);
    assert_eq!(x.remedies.len(), 2);
    assert!(x.message.starts_with("fragmentation: the 1.5 GiB request"));
    // Parsing is the same as the core type's own reading of the wire shape.
    let direct: crate::core::detect::explanation::Explanation =
        serde_json::from_str(FRAGMENTATION).unwrap();
    assert_eq!(*x, direct);
}

#[test]
fn live_sites_are_kept_largest_first_whatever_the_order_sent() {
    let line = oom_with(|x| {
        let sites = x["live_sites"].as_array_mut().unwrap();
        let mut small = sites[0].clone();
        small["bytes"] = 1024.into();
        small["function"] = "small".into();
        sites.insert(0, small);
    });
    let Message::Event(e) = parse(line.as_bytes()).unwrap() else {
        panic!()
    };
    let x = e.explanation.unwrap();
    assert_eq!(x.top_live().unwrap().bytes, 1_321_205_760);
    assert_eq!(x.live_sites.last().unwrap().function, "small");
    assert!(x.live_sites.windows(2).all(|w| w[0].bytes >= w[1].bytes));
}

#[test]
fn without_history_or_with_unknown_patterns_it_still_reads() {
    let line = oom_with(|x| {
        *x = json!({"pattern": "fragmentation", "history": false, "failing_site": null,
                    "live_sites": [], "reasons": ["allocation history was not recording"]});
    });
    let Message::Event(e) = parse(line.as_bytes()).unwrap() else {
        panic!()
    };
    let x = e.explanation.unwrap();
    assert!(!x.history && x.failing_site.is_none() && x.live_sites.is_empty());
    assert_eq!(x.request_bytes, None);
    for (sent, read) in [
        ("thrash", Pattern::Unknown),
        ("none", Pattern::Unknown),
        ("leak", Pattern::Leak),
        ("pressure", Pattern::Pressure),
    ] {
        let Message::Event(e) = parse(oom_with(|x| x["pattern"] = sent.into()).as_bytes()).unwrap()
        else {
            panic!()
        };
        assert_eq!(e.explanation.unwrap().pattern, read, "{sent}");
    }
    // Null is no explanation; an oom without one is as before.
    let plain = r#"{"type":"event","ts":1763700400.0,"kind":"oom","explanation":null}"#;
    let Message::Event(e) = parse(plain.as_bytes()).unwrap() else {
        panic!()
    };
    assert!(e.explanation.is_none());
}

#[test]
fn an_explanation_over_a_limit_is_refused_whole_naming_it() {
    let site: Value =
        serde_json::from_str::<Value>(FRAGMENTATION).unwrap()["live_sites"][0].clone();
    let frame = json!({"file": "a.py", "line": 1, "function": "f"});
    let long = "x".repeat(MAX_STR + 1);
    let cases: Vec<(String, String)> = vec![
        (
            oom_with(|x| x["live_sites"] = Value::Array(vec![site.clone(); MAX_SITES + 1])),
            format!("explanation.live_sites has 21 entries; at most {MAX_SITES} are accepted"),
        ),
        (
            oom_with(|x| {
                x["live_sites"][0]["stack"] = Value::Array(vec![frame.clone(); MAX_STACK + 1])
            }),
            "explanation.live_sites[0].stack has 33 frames; at most 32".into(),
        ),
        (
            oom_with(|x| {
                x["failing_site"]["stack"] = Value::Array(vec![frame.clone(); MAX_STACK + 1])
            }),
            "explanation.failing_site.stack has 33 frames; at most 32".into(),
        ),
        (
            oom_with(|x| x["reasons"] = Value::Array(vec!["r".into(); MAX_NOTES + 1])),
            "explanation.reasons has 9 entries; at most 8".into(),
        ),
        (
            oom_with(|x| x["remedies"] = Value::Array(vec!["r".into(); MAX_NOTES + 1])),
            "explanation.remedies has 9 entries; at most 8".into(),
        ),
        (
            oom_with(|x| x["reasons"][0] = long.clone().into()),
            "explanation.reasons[0] is 513 bytes long; keep it under 512".into(),
        ),
        (
            oom_with(|x| x["remedies"][1] = long.clone().into()),
            "explanation.remedies[1] is 513 bytes long".into(),
        ),
        (
            oom_with(|x| x["message"] = long.clone().into()),
            "explanation.message is 513 bytes long".into(),
        ),
        (
            oom_with(|x| x["failing_site"]["file"] = long.clone().into()),
            "explanation.failing_site.file is 513 bytes long".into(),
        ),
        (
            oom_with(|x| x["failing_site"]["stack"][1]["function"] = long.clone().into()),
            "explanation.failing_site.stack[1].function is 513 bytes long".into(),
        ),
        (
            oom_with(|x| x["live_sites"][0]["function"] = long.clone().into()),
            "explanation.live_sites[0].function is 513 bytes long".into(),
        ),
        (
            oom_with(|x| x["request_bytes"] = (1u64 << 51).into()),
            "explanation.request_bytes = 2251799813685248 is not a plausible byte count".into(),
        ),
        (
            oom_with(|x| x["live_sites"][0]["bytes"] = (1u64 << 51).into()),
            "explanation.live_sites[0].bytes = 2251799813685248".into(),
        ),
        (
            oom_with(|x| x["pattern"] = "p".repeat(200).into()),
            "explanation.pattern is 200 bytes long".into(),
        ),
    ];
    for (line, wanted) in cases {
        let r = refused(&line);
        assert_eq!(r.code, Code::BadField, "{wanted}");
        assert!(
            r.message.contains(&wanted),
            "{wanted:?} not in {:?}",
            r.message
        );
    }
}

#[test]
fn an_explanation_of_the_wrong_type_is_refused_naming_the_field() {
    let cases: Vec<(String, &str)> = vec![
        (
            oom_with(|x| *x = json!("fragmentation")),
            "explanation = \"fragmentation\" is not an object",
        ),
        (
            oom_with(|x| *x = json!([1])),
            "explanation = [1] is not an object",
        ),
        (
            oom_with(|x| x["pattern"] = json!(3)),
            "explanation.pattern = 3 is not a pattern name",
        ),
        (
            oom_with(|x| {
                x.as_object_mut().unwrap().remove("pattern");
            }),
            "explanation needs \"pattern\"",
        ),
        (
            oom_with(|x| x["history"] = json!("yes")),
            "explanation.history = \"yes\" is not true or false",
        ),
        (
            oom_with(|x| x["request_bytes"] = json!(-1)),
            "explanation.request_bytes = -1 is not a byte count",
        ),
        (
            oom_with(|x| x["request_bytes"] = json!(1.5)),
            "explanation.request_bytes = 1.5 is not a byte count",
        ),
        (
            oom_with(|x| x["failing_site"] = json!(37)),
            "explanation.failing_site = 37 is not an object",
        ),
        (
            oom_with(|x| {
                x["failing_site"].as_object_mut().unwrap().remove("line");
            }),
            "explanation.failing_site needs \"line\"",
        ),
        (
            oom_with(|x| x["failing_site"]["line"] = json!("37")),
            "explanation.failing_site.line = \"37\" is not a line number",
        ),
        (
            oom_with(|x| x["failing_site"]["stack"] = json!({})),
            "explanation.failing_site.stack = {} is not a list of frames",
        ),
        (
            oom_with(|x| x["live_sites"] = json!({})),
            "explanation.live_sites = {} is not a list of sites",
        ),
        (
            oom_with(|x| {
                x["live_sites"][0].as_object_mut().unwrap().remove("bytes");
            }),
            "explanation.live_sites[0] needs \"bytes\"",
        ),
        (
            oom_with(|x| x["reasons"] = json!("r")),
            "explanation.reasons = \"r\" is not a list of strings",
        ),
        (
            oom_with(|x| x["remedies"][0] = json!(7)),
            "explanation.remedies[0] = 7 is not a string",
        ),
        (
            oom_with(|x| x["message"] = json!(["m"])),
            "explanation.message = [\"m\"] is not a string",
        ),
    ];
    for (line, wanted) in cases {
        let r = refused(&line);
        assert_eq!(r.code, Code::BadField, "{wanted}");
        assert!(
            r.message.contains(wanted),
            "{wanted:?} not in {:?}",
            r.message
        );
    }
}

#[test]
fn only_an_oom_event_carries_an_explanation() {
    for kind in ["mark", "phase", "snapshot", "nap"] {
        let line = oom_with(|_| {}).replace(r#""kind":"oom""#, &format!(r#""kind":"{kind}""#));
        let r = refused(&line);
        assert_eq!(r.code, Code::BadField);
        assert_eq!(
            r.message,
            format!("explanation on a \"{kind}\" event; only an oom event carries one")
        );
    }
}
