use super::*;

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
    }
    .to_line();
    assert_eq!(
        String::from_utf8(w).unwrap(),
        "{\"type\":\"welcome\",\"v\":1,\"server\":\"gpumon/0.1.0\",\"session\":\"s-17\"}\n"
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
