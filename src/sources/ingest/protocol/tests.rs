use super::*;
use crate::core::detect::attribution::Attribution;

fn code(line: &str) -> Code {
    parse(line.as_bytes()).unwrap_err().code
}

const SAMPLE: &str = r#"{"type":"sample","ts":1763700000.123,"step":1200,"phase":"train","stats":{"allocated_bytes.all.current":21474836480,"allocated_bytes.all.peak":30064771072,"reserved_bytes.all.current":32212254720,"active_bytes.all.current":21474836480,"inactive_split_bytes.all.current":268435456,"requested_bytes.all.current":21400000000,"num_alloc_retries":0,"num_ooms":0,"num_sync_all_streams":0,"num_device_alloc":120,"num_device_free":3,"segment.all.current":7},"device_free":47244640256,"device_total":85520809984}"#;

#[test]
fn parses_the_contract_examples() {
    let hello = r#"{"type":"hello","v":1,"pid":4242,"job":"llama-ft","rank":0,"world_size":8,"cuda_device":0,"gpu_uuid":"GPU-8f0c3e1a","client":"gpumon-py/0.1.0","torch":"2.5.1","allocator":"native","expandable_segments":false}"#;
    let Message::Hello(h) = parse(hello.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(h.ns_pid, Some(4242));
    assert_eq!(h.job.as_deref(), Some("llama-ft"));
    assert_eq!(h.gpu_uuid.as_deref(), Some("GPU-8f0c3e1a"));

    let Message::Sample(s) = parse(SAMPLE.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(s.step, Some(1200));
    assert_eq!(s.stats.allocated, Some(21_474_836_480));
    assert_eq!(s.stats.device_free, Some(3));
    assert_eq!(s.device_total, Some(85_520_809_984));

    let ev = r#"{"type":"event","ts":1763700100.5,"kind":"oom","alloc_bytes":2147483648,"device_free":104857600,"detail":"CUDA out of memory. Tried to allocate 2.00 GiB"}"#;
    let Message::Event(e) = parse(ev.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(e.kind, "oom");
    assert_eq!(e.alloc_bytes, Some(2_147_483_648));

    assert_eq!(
        parse(br#"{"type":"bye","ts":1763700200.0}"#).unwrap(),
        Message::Bye {
            ts: Some(1_763_700_200.0)
        }
    );
}

#[test]
fn unknown_fields_are_ignored_and_phase_defaults_to_train() {
    let Message::Sample(s) =
        parse(br#"{"type":"sample","ts":1763700000,"future_field":{"x":[1,2]}}"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(s.phase, "train");
    assert_eq!(s.stats, Stats::default());
}

#[test]
fn each_bad_input_gets_its_code() {
    assert_eq!(code("{not json"), Code::BadJson);
    assert_eq!(code(r#"{"type":"sample","ts":1763700000"#), Code::BadJson);
    assert_eq!(code("[1,2]"), Code::BadField);
    assert_eq!(code(r#"{"ts":1763700000}"#), Code::BadField);
    assert_eq!(
        code(r#"{"type":"dance","ts":1763700000}"#),
        Code::UnknownType
    );
    assert_eq!(code(r#"{"type":"hello","v":2}"#), Code::UnsupportedVersion);
    assert_eq!(code(r#"{"type":"hello"}"#), Code::BadField);
    assert_eq!(code(r#"{"type":"sample"}"#), Code::BadField);
    assert_eq!(code(r#"{"type":"sample","ts":"now"}"#), Code::BadField);
    assert_eq!(
        code(r#"{"type":"sample","ts":1763700000,"step":-1}"#),
        Code::BadField
    );
    assert_eq!(
        code(r#"{"type":"sample","ts":1763700000,"step":1.5}"#),
        Code::BadField
    );
    assert_eq!(code(r#"{"type":"sample","ts":-5}"#), Code::BadField);
    assert_eq!(code(r#"{"type":"sample","ts":1e300}"#), Code::BadField);
    assert_eq!(code(r#"{"type":"sample","ts":NaN}"#), Code::BadJson);
    assert_eq!(
        code(r#"{"type":"sample","ts":1763700000,"device_free":1e30}"#),
        Code::BadField
    );
    assert_eq!(code(r#"{"type":"event","ts":1763700000}"#), Code::BadField);
    assert_eq!(
        parse(b"{\"type\":\"bye\",\"x\":\"\xff\"}")
            .unwrap_err()
            .code,
        Code::BadJson
    );
}

#[test]
fn bad_stats_values_are_named() {
    for (value, needle) in [
        ("-1", "-1"),
        ("1.5", "1.5"),
        ("\"big\"", "big"),
        ("1e20", "1e+20"),
    ] {
        let line = format!(r#"{{"type":"sample","ts":1763700000,"stats":{{"num_ooms":{value}}}}}"#);
        let err = parse(line.as_bytes()).unwrap_err();
        assert_eq!(err.code, Code::BadField, "{value}");
        assert!(err.message.contains("num_ooms"), "{}", err.message);
        assert!(err.message.contains(needle), "{}", err.message);
    }
}

#[test]
fn long_lines_and_long_labels_are_refused() {
    let long = vec![b'x'; MAX_LINE + 1];
    assert_eq!(parse(&long).unwrap_err().code, Code::LineTooLong);
    let job = "j".repeat(500);
    let line = format!(r#"{{"type":"hello","v":1,"job":"{job}"}}"#);
    let err = parse(line.as_bytes()).unwrap_err();
    assert_eq!(err.code, Code::BadField);
    assert!(err.message.contains("job"));
}

#[test]
fn error_messages_quote_a_clipped_value() {
    let t = "z".repeat(10_000);
    let err = parse(format!(r#"{{"type":"{t}"}}"#).as_bytes()).unwrap_err();
    assert_eq!(err.code, Code::UnknownType);
    assert!(err.message.len() < 200, "{}", err.message.len());
}

/// Found by the `parse` fuzz target: a wrong-typed value was quoted back whole, so a 64 KiB
/// line earned a reply as long (longer, with escapes).
#[test]
fn hostile_values_are_not_echoed_back_at_length() {
    let long = "j".repeat(60_000);
    let ctrl = "\\u0001".repeat(10_000);
    let cases = [
        (
            format!(r#"{{"type":"hello","v":1,"pid":"{long}"}}"#),
            "expected u64",
        ),
        (
            format!(r#"{{"type":"sample","ts":"{ctrl}"}}"#),
            "expected f64",
        ),
        (
            format!(r#"{{"type":"sample","ts":1763700000,"stats":{{"num_ooms":"{long}"}}}}"#),
            "num_ooms",
        ),
        (
            format!(
                r#"{{"type":"sample","ts":1763700000,"stats":{{"num_ooms":[{}1]}}}}"#,
                "1,".repeat(9000)
            ),
            "num_ooms",
        ),
        (format!(r#"{{"type":"{ctrl}"}}"#), "unknown type"),
        (
            format!(r#"{{"type":"{}"}}"#, "\u{e0000}".repeat(5000)),
            "unknown type",
        ),
    ];
    for (line, needle) in cases {
        let err = parse(line.as_bytes()).unwrap_err();
        assert!(
            err.message.len() <= 300,
            "{} bytes: {}",
            err.message.len(),
            err.message
        );
        assert!(err.message.contains(needle), "{}", err.message);
        assert!(err.message.contains("..."), "{}", err.message);
    }
    // The decoder's column survives the cut: it says where the bad value is.
    let err = parse(format!(r#"{{"type":"hello","v":1,"pid":"{long}"}}"#).as_bytes()).unwrap_err();
    assert!(err.message.contains("column 60030"), "{}", err.message);
}

#[test]
fn shorten_cuts_on_char_boundaries() {
    let s = "é".repeat(100);
    let short = shorten(&s, 80);
    assert!(short.len() <= 80 && short.contains("..."), "{short}");
    assert_eq!(shorten("short", 80), "short");
}

#[test]
fn replies_are_single_json_lines() {
    let w = Reply::Welcome {
        v: 1,
        server: "gpumon/0.1.0",
        session: "s-17",
        max_lines_per_second: None,
        ack: false,
    }
    .to_line();
    assert_eq!(
        String::from_utf8(w).unwrap(),
        "{\"type\":\"welcome\",\"v\":1,\"server\":\"gpumon/0.1.0\",\"session\":\"s-17\"}\n"
    );
    assert_eq!(
        Reply::Ack { seq: 42 }.to_line(),
        b"{\"type\":\"ack\",\"seq\":42}\n"
    );
    let e = Reply::Error {
        code: Code::BadJson,
        line: 12,
        message: "x\ny",
    }
    .to_line();
    let text = String::from_utf8(e).unwrap();
    assert_eq!(text.matches('\n').count(), 1);
    assert!(text.starts_with("{\"type\":\"error\",\"code\":\"bad_json\",\"line\":12,"));
}

#[test]
fn every_code_has_its_wire_name() {
    for c in Code::ALL {
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, format!("\"{}\"", c.as_str()));
    }
}

#[test]
fn alloc_limit_is_read_from_hello_sample_and_event() {
    let cap = 5_100_273_664u64;
    let hello = format!(r#"{{"type":"hello","v":1,"alloc_limit":{cap}}}"#);
    let Message::Hello(h) = parse(hello.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(h.alloc_limit, Some(cap));
    let sample = format!(r#"{{"type":"sample","ts":1763700000,"step":3,"alloc_limit":{cap}}}"#);
    let Message::Sample(s) = parse(sample.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(s.alloc_limit, Some(cap));
    let ev = format!(
        r#"{{"type":"event","ts":1763700000,"kind":"oom","alloc_bytes":402653184,"device_free":79456894976,"alloc_limit":{cap}}}"#
    );
    let Message::Event(e) = parse(ev.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(
        (e.alloc_bytes, e.alloc_limit),
        (Some(402_653_184), Some(cap))
    );
    // Optional everywhere: absent or null is "no cap known".
    let Message::Sample(s) = parse(SAMPLE.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(s.alloc_limit, None);
    let Message::Hello(h) = parse(br#"{"type":"hello","v":1,"alloc_limit":null}"#).unwrap() else {
        panic!()
    };
    assert_eq!(h.alloc_limit, None);
}

#[test]
fn a_bad_alloc_limit_is_a_bad_field_naming_it_and_its_value() {
    let heads = [
        r#"{"type":"hello","v":1,"#,
        r#"{"type":"sample","ts":1763700000,"#,
        r#"{"type":"event","ts":1763700000,"kind":"oom","#,
    ];
    for head in heads {
        for (value, needle) in [
            ("-1", "-1"),
            ("1.5", "1.5"),
            ("\"4GiB\"", "4GiB"),
            ("[1]", "[1]"),
            ("2251799813685248", "2251799813685248"),
        ] {
            let line = format!(r#"{head}"alloc_limit":{value}}}"#);
            let err = parse(line.as_bytes()).unwrap_err();
            assert_eq!(err.code, Code::BadField, "{line}");
            assert!(err.message.contains("alloc_limit"), "{}", err.message);
            assert!(err.message.contains(needle), "{}", err.message);
        }
    }
    // A hostile value is quoted clipped, not whole.
    let long = "9".repeat(20_000);
    let err = parse(format!(r#"{{"type":"hello","v":1,"alloc_limit":"{long}"}}"#).as_bytes())
        .unwrap_err();
    assert_eq!(err.code, Code::BadField);
    assert!(err.message.len() < 200, "{}", err.message);
}

const ATTRIBUTION: &str = r#"{"type":"attribution","id":1,"ts":1763700300.0,"step_from":610,"step_to":730,"seconds":61.2,"total_growth_bytes":125829120,"sites":[{"file":"/home/alice/proj/train.py","line":27,"function":"kept_outputs","bytes":125829120,"blocks":120,"stack":[{"file":"/home/alice/proj/train.py","line":27,"function":"kept_outputs"},{"file":"/home/alice/proj/train.py","line":48,"function":"run"}],"note":"..."}]}"#;

fn attribution(line: &str) -> Attribution {
    match parse(line.as_bytes()) {
        Ok(Message::Attribution(a)) => a,
        other => panic!("{other:?}"),
    }
}

/// The contract example with `sites[0]` changed by `edit`.
fn with_site(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(ATTRIBUTION).unwrap();
    edit(&mut v["sites"][0]);
    v.to_string()
}

#[test]
fn hello_caps_are_read_and_bounded() {
    let Message::Hello(h) =
        parse(br#"{"type":"hello","v":1,"caps":["attribution","teleport"]}"#).unwrap()
    else {
        panic!()
    };
    assert!(h.can(CAP_ATTRIBUTION));
    assert!(!h.can("fly"));
    let Message::Hello(old) = parse(br#"{"type":"hello","v":1}"#).unwrap() else {
        panic!()
    };
    assert!(old.caps.is_empty() && !old.can(CAP_ATTRIBUTION));
    let many = format!(
        r#"{{"type":"hello","v":1,"caps":[{}]}}"#,
        vec!["\"x\""; 17].join(",")
    );
    let long = format!(r#"{{"type":"hello","v":1,"caps":["{}"]}}"#, "c".repeat(33));
    for (line, needle) in [
        (many, "17"),
        (long, "33 bytes"),
        (
            r#"{"type":"hello","v":1,"caps":"attribution"}"#.into(),
            "caps",
        ),
        (r#"{"type":"hello","v":1,"caps":[7]}"#.into(), "caps[0] = 7"),
    ] {
        let err = parse(line.as_bytes()).unwrap_err();
        assert_eq!(err.code, Code::BadField, "{line}");
        assert!(
            err.message.contains("caps") && err.message.contains(needle),
            "{}",
            err.message
        );
    }
}

#[test]
fn an_attribution_parses_as_the_contract_writes_it() {
    let a = attribution(ATTRIBUTION);
    assert_eq!((a.id, a.step_from, a.step_to), (1, Some(610), Some(730)));
    assert_eq!(a.seconds, Some(61.2));
    assert_eq!(a.total_growth_bytes, 125_829_120);
    let s = &a.sites[0];
    assert_eq!(
        (s.file.as_str(), s.line, s.function.as_str()),
        ("/home/alice/proj/train.py", 27, "kept_outputs")
    );
    assert_eq!((s.bytes, s.blocks), (125_829_120, 120));
    assert_eq!(s.stack.len(), 2);
    assert_eq!((s.stack[1].line, s.stack[1].function.as_str()), (48, "run"));
    assert_eq!(s.note.as_deref(), Some("..."));
    assert_eq!((a.error, a.finding), (None, None));
    // The daemon names the finding from its own request; a client's claim is ignored.
    let claimed = ATTRIBUTION.replacen("\"id\":1,", "\"id\":1,\"finding\":\"s-9/leak\",", 1);
    assert_eq!(attribution(&claimed).finding, None);
    let failed = attribution(
        r#"{"type":"attribution","id":2,"ts":1763700300,"error":"unavailable","detail":"torch.cuda is not available"}"#,
    );
    assert_eq!(failed.error.as_deref(), Some("unavailable"));
    assert_eq!(
        failed.detail.as_deref(),
        Some("torch.cuda is not available")
    );
    assert!(failed.sites.is_empty());
}

#[test]
fn an_attribution_over_a_limit_is_refused_whole_naming_it() {
    use crate::core::detect::attribution::{MAX_SITES, MAX_STACK, MAX_STR};
    let site: serde_json::Value = serde_json::from_str(ATTRIBUTION).unwrap();
    let site = site["sites"][0].clone();
    let mut sites = serde_json::from_str::<serde_json::Value>(ATTRIBUTION).unwrap();
    sites["sites"] = serde_json::Value::Array(vec![site; MAX_SITES + 1]);
    let frame = serde_json::json!({"file":"a.py","line":1,"function":"f"});
    let long = "f".repeat(MAX_STR + 1);
    let cases: Vec<(String, &str)> = vec![
        (sites.to_string(), "at most 20"),
        (
            with_site(|s| s["stack"] = serde_json::Value::Array(vec![frame; MAX_STACK + 1])),
            "sites[0].stack has 33 frames",
        ),
        (
            with_site(|s| s["file"] = long.clone().into()),
            "sites[0].file is 513 bytes",
        ),
        (
            with_site(|s| s["function"] = long.clone().into()),
            "sites[0].function",
        ),
        (
            with_site(|s| s["note"] = long.clone().into()),
            "sites[0].note",
        ),
        (
            with_site(|s| s["stack"][1]["file"] = long.clone().into()),
            "sites[0].stack[1].file is 513 bytes",
        ),
        (
            with_site(|s| s["bytes"] = (1u64 << 51).into()),
            "sites[0].bytes = 2251799813685248",
        ),
        (
            with_site(|s| s["bytes"] = (-1).into()),
            "sites[0].bytes = -1",
        ),
        (
            with_site(|s| s["blocks"] = 1.5.into()),
            "sites[0].blocks = 1.5",
        ),
        (
            with_site(|s| s["line"] = "27".into()),
            "sites[0].line = \"27\"",
        ),
        (
            with_site(|s| s["line"] = (1u64 << 40).into()),
            "sites[0].line",
        ),
        (
            with_site(|s| s["stack"][0]["line"] = (-3).into()),
            "sites[0].stack[0].line = -3",
        ),
        (
            with_site(|s| s["stack"] = "deep".into()),
            "sites[0].stack = \"deep\"",
        ),
        (
            with_site(|s| s["stack"][0] = 5.into()),
            "sites[0].stack[0] = 5",
        ),
        (
            with_site(|s| drop(s.as_object_mut().unwrap().remove("file"))),
            "sites[0] needs \"file\"",
        ),
        (
            with_site(|s| drop(s.as_object_mut().unwrap().remove("bytes"))),
            "sites[0] needs \"bytes\"",
        ),
        (
            with_site(|s| *s = "train.py:27".into()),
            "sites[0] = \"train.py:27\"",
        ),
        (
            ATTRIBUTION
                .replace("\"sites\":[", "\"sites\":{\"a\":[")
                .replace("]}", "]}}"),
            "sites = ",
        ),
        (
            ATTRIBUTION.replace("125829120,\"sites\"", "\"lots\",\"sites\""),
            "total_growth_bytes = \"lots\"",
        ),
        (
            ATTRIBUTION.replace("\"seconds\":61.2", "\"seconds\":-1"),
            "seconds = -1",
        ),
        (ATTRIBUTION.replace("\"id\":1,", ""), "needs \"id\""),
        (
            ATTRIBUTION.replace("\"ts\":1763700300.0,", ""),
            "needs \"ts\"",
        ),
        (
            format!(
                r#"{{"type":"attribution","id":1,"ts":1763700300,"error":"failed","detail":"{long}"}}"#
            ),
            "detail is 513 bytes",
        ),
        (
            format!(
                r#"{{"type":"attribution","id":1,"ts":1763700300,"error":"{}"}}"#,
                "e".repeat(40)
            ),
            "error is 40 bytes",
        ),
    ];
    for (line, needle) in cases {
        let err = parse(line.as_bytes()).unwrap_err();
        assert_eq!(err.code, Code::BadField, "{line}: {}", err.message);
        assert!(err.message.contains(needle), "{needle}: {}", err.message);
        assert!(err.message.len() < 300, "{}", err.message);
    }
    // Decoder-level type errors are bad_field too.
    assert_eq!(
        code(&ATTRIBUTION.replace("\"id\":1", "\"id\":-1")),
        Code::BadField
    );
    assert_eq!(
        code(&ATTRIBUTION.replace("\"step_from\":610", "\"step_from\":\"x\"")),
        Code::BadField
    );
}

#[test]
fn hostile_attribution_values_are_not_echoed_at_length() {
    let huge = "9".repeat(30_000);
    let line = with_site(|s| s["line"] = serde_json::Value::String(huge.clone()));
    let err = parse(line.as_bytes()).unwrap_err();
    assert_eq!(err.code, Code::BadField);
    assert!(
        err.message.len() < 300 && err.message.contains("..."),
        "{}",
        err.message
    );
    // Deep nesting stops at the decoder's recursion limit, with an error, not a crash.
    let deep = format!(
        r#"{{"type":"attribution","id":1,"ts":1763700300,"sites":{}{}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    assert!(parse(deep.as_bytes()).is_err());
}

#[test]
fn the_attribute_request_is_the_contract_line() {
    let line = Reply::Attribute {
        v: ATTRIBUTE_VERSION,
        id: 1,
        finding: "s-17/leak",
        steps: 120,
        seconds: 120.0,
        max_entries: 4000,
        top: 10,
    }
    .to_line();
    assert_eq!(
        String::from_utf8(line).unwrap(),
        "{\"type\":\"attribute\",\"v\":1,\"id\":1,\"finding\":\"s-17/leak\",\"steps\":120,\"seconds\":120,\"max_entries\":4000,\"top\":10}\n"
    );
    let odd = Reply::Attribute {
        v: 1,
        id: 2,
        finding: "s-1/leak",
        steps: 20,
        seconds: 90.5,
        max_entries: 1,
        top: 1,
    }
    .to_line();
    assert!(String::from_utf8(odd)
        .unwrap()
        .contains("\"seconds\":90.5,"));
}

#[test]
fn seq_is_read_from_every_line_but_hello() {
    let (m, seq) = parse_numbered(br#"{"type":"sample","ts":1763700000,"seq":7}"#).unwrap();
    assert!(matches!(m, Message::Sample(_)));
    assert_eq!(seq, Some(7));
    let (_, seq) = parse_numbered(br#"{"type":"event","ts":1763700000,"kind":"mark"}"#).unwrap();
    assert_eq!(seq, None);
    let (m, seq) =
        parse_numbered(br#"{"type":"hello","v":1,"seq":3,"caps":["ack"],"instance":"c-9f2e"}"#)
            .unwrap();
    assert_eq!(
        seq, None,
        "a hello belongs to its connection and is never numbered"
    );
    let Message::Hello(h) = m else {
        panic!("hello")
    };
    assert!(h.can(CAP_ACK));
    assert_eq!(h.instance.as_deref(), Some("c-9f2e"));
    let bad = parse(br#"{"type":"sample","ts":1763700000,"seq":-1}"#).unwrap_err();
    assert_eq!(bad.code, Code::BadField);
    assert!(bad.message.contains("-1"), "{}", bad.message);
}

/// Keys are matched without copying them, but a key written with escapes is still the same key;
/// null is "not reported"; a count past 2^50 and a nested value are named, as any bad value is.
#[test]
fn stats_keys_match_however_written_and_odd_values_are_named() {
    let line = r#"{"type":"sample","ts":1763700000,"stats":{"allocated_bytes.all.curren\u0074":7,"num_ooms":null,"num_device_free":2}}"#;
    let Message::Sample(s) = parse(line.as_bytes()).unwrap() else {
        panic!("a sample")
    };
    assert_eq!(s.stats.allocated, Some(7));
    assert_eq!(s.stats.ooms, None);
    assert_eq!(s.stats.device_free, Some(2));
    for (value, needle) in [
        ("1125899906842625", "= 1125899906842625"),
        (r#"{"a":1}"#, r#"= {"a":1}"#),
        ("true", "= true"),
    ] {
        let line = format!(r#"{{"type":"sample","ts":1763700000,"stats":{{"num_ooms":{value}}}}}"#);
        let err = parse(line.as_bytes()).unwrap_err();
        assert_eq!(err.code, Code::BadField, "{value}");
        assert!(
            err.message
                .contains(&format!("stats[\"num_ooms\"] {needle}")),
            "{}",
            err.message
        );
    }
}

mod explanation;

#[test]
fn hello_run_id_is_kept_as_sent_and_bounded() {
    let Message::Hello(h) =
        parse(br#"{"type":"hello","v":1,"job":"llama","run_id":"torchelastic-4f2a","restart":2}"#)
            .unwrap()
    else {
        panic!()
    };
    assert_eq!(h.run_id.as_deref(), Some("torchelastic-4f2a"));
    assert_eq!(h.restart, Some(2));
    // Control characters are a label's bytes like any other: kept, and escaped wherever a
    // person reads them (the TUI, status, alerts), never sent raw to a terminal.
    let Message::Hello(h) =
        parse(br#"{"type":"hello","v":1,"run_id":"r\u001b[2J\u0007"}"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(h.run_id.as_deref(), Some("r\u{1b}[2J\u{7}"));
    let long = format!(r#"{{"type":"hello","v":1,"run_id":"{}"}}"#, "r".repeat(129));
    let err = parse(long.as_bytes()).unwrap_err();
    assert_eq!(err.code, Code::BadField);
    assert!(err.message.contains("run_id"), "{}", err.message);
    let err = parse(br#"{"type":"hello","v":1,"restart":-1}"#).unwrap_err();
    assert_eq!(err.code, Code::BadField);
}

#[test]
fn a_run_id_of_none_or_empty_names_no_run() {
    // torchrun's default run id for static multi-node runs is "none", the same for every run.
    for run in ["none", "NONE", "", "  "] {
        let line = format!(r#"{{"type":"hello","v":1,"job":"llama","run_id":"{run}"}}"#);
        let Message::Hello(h) = parse(line.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(h.run_id, None, "{run:?}");
    }
    let Message::Hello(h) = parse(br#"{"type":"hello","v":1,"run_id":"none-7"}"#).unwrap() else {
        panic!()
    };
    assert_eq!(h.run_id.as_deref(), Some("none-7"));
}

fn ending(line: &str) -> Option<crate::core::trainer::Exit> {
    match parse(line.as_bytes()) {
        Ok(Message::Event(e)) => e.ending,
        other => panic!("not an event: {other:?}"),
    }
}

#[test]
fn an_events_ending_is_read_and_a_bad_one_named() {
    use crate::core::trainer::Exit;
    let sig = r#"{"type":"event","ts":1763700200,"kind":"mark","detail":"trainer got SIGTERM","ending":"signal","signal":"SIGTERM"}"#;
    assert_eq!(ending(sig), Some(Exit::Signal("SIGTERM".into())));
    let exc = r#"{"type":"event","ts":1763700200,"kind":"mark","detail":"trainer died: RuntimeError: boom","ending":"exception","exception":"RuntimeError"}"#;
    assert_eq!(
        ending(exc),
        Some(Exit::Exception("RuntimeError: boom".into()))
    );
    // Without a detail the type alone; a long message is kept bounded.
    let bare = r#"{"type":"event","ts":1763700200,"kind":"mark","ending":"exception","exception":"KeyError"}"#;
    assert_eq!(ending(bare), Some(Exit::Exception("KeyError".into())));
    let long = format!(
        r#"{{"type":"event","ts":1763700200,"kind":"mark","detail":"{}","ending":"exception","exception":"E"}}"#,
        "é".repeat(1000)
    );
    match ending(&long) {
        Some(Exit::Exception(t)) => assert!(t.len() <= 512 && t.starts_with("E: é")),
        other => panic!("{other:?}"),
    }
    // An ending this build does not know is no error (a newer client's).
    let newer = r#"{"type":"event","ts":1763700200,"kind":"mark","ending":"reboot"}"#;
    assert_eq!(ending(newer), None);
    for (line, says) in [
        (
            r#"{"type":"event","ts":1763700200,"kind":"mark","ending":"signal"}"#,
            "needs \"signal\"",
        ),
        (
            r#"{"type":"event","ts":1763700200,"kind":"mark","ending":"exception","exception":""}"#,
            "needs \"exception\"",
        ),
    ] {
        let e = parse(line.as_bytes()).unwrap_err();
        assert_eq!(e.code, Code::BadField);
        assert!(e.message.contains(says), "{}", e.message);
    }
}

#[test]
fn hello_carries_the_allocator_settings_and_refuses_a_long_one_by_name() {
    let hello = r#"{"type":"hello","v":1,"pid":1,"alloc_conf":"max_split_size_mb:128,expandable_segments:True"}"#;
    let Message::Hello(h) = parse(hello.as_bytes()).unwrap() else {
        panic!()
    };
    assert_eq!(
        h.alloc_conf.as_deref(),
        Some("max_split_size_mb:128,expandable_segments:True")
    );
    // An older client sends none: the hello is as before.
    let Message::Hello(h) = parse(br#"{"type":"hello","v":1}"#).unwrap() else {
        panic!()
    };
    assert_eq!(h.alloc_conf, None);
    let long = format!(
        r#"{{"type":"hello","v":1,"alloc_conf":"{}"}}"#,
        "x".repeat(129)
    );
    let e = parse(long.as_bytes()).unwrap_err();
    assert_eq!(e.code, Code::BadField);
    assert!(e.message.contains("alloc_conf"), "{}", e.message);
}
