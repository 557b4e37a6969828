use super::super::{parse, Code, Message};
use crate::core::detect::attribution::{MAX_SITES, MAX_STACK, MAX_STR};
use serde_json::{json, Value};

/// The contract's example.
fn example() -> Value {
    json!({"type":"peak","id":2,"ts":1763700410.0,"step_from":1210,"step_to":1230,
        "peak_bytes":4093640704u64,
        "sites":[{"file":"/home/alice/proj/model.py","line":88,"function":"attention",
            "bytes":2147483648u64,"blocks":48,
            "stack":[{"file":"/home/alice/proj/model.py","line":88,"function":"attention"}]}]})
}

#[test]
fn the_contract_examples_parse() {
    let Ok(Message::Peak(p)) = parse(example().to_string().as_bytes()) else {
        panic!("not a peak");
    };
    assert_eq!((p.id, p.peak_bytes), (2, 4_093_640_704));
    assert_eq!((p.step_from, p.step_to), (Some(1210), Some(1230)));
    assert_eq!(p.sites[0].short(), "model.py:88");
    assert_eq!(p.sites[0].stack.len(), 1);
    assert!(p.finding.is_none());
    let failed =
        br#"{"type":"peak","id":2,"ts":1763700410,"error":"failed","detail":"snapshot raised"}"#;
    let Ok(Message::Peak(p)) = parse(failed) else {
        panic!("not a peak");
    };
    assert_eq!((p.error.as_deref(), p.peak_bytes), (Some("failed"), 0));
    let Ok(Message::Armed(a)) = parse(br#"{"type":"armed","id":2,"ts":1763700400.0}"#) else {
        panic!("not armed");
    };
    assert_eq!((a.id, a.error), (2, None));
    let Ok(Message::Armed(a)) = parse(
        br#"{"type":"armed","id":2,"ts":1763700400,"error":"unavailable","detail":"CUDA is not available"}"#,
    ) else {
        panic!("not armed");
    };
    assert_eq!(a.error.as_deref(), Some("unavailable"));
}

#[test]
fn sites_are_kept_largest_first_whatever_the_order_sent() {
    let mut v = example();
    let small = json!({"file":"/x/a.py","line":1,"function":"small","bytes":1024,"blocks":1});
    let big = json!({"file":"/x/b.py","line":2,"function":"big","bytes":8589934592u64,"blocks":2});
    v["sites"].as_array_mut().unwrap().insert(0, small);
    v["sites"].as_array_mut().unwrap().push(big);
    let Ok(Message::Peak(p)) = parse(v.to_string().as_bytes()) else {
        panic!("not a peak");
    };
    let order: Vec<_> = p.sites.iter().map(|s| s.function.as_str()).collect();
    assert_eq!(order, ["big", "attention", "small"]);
    assert_eq!(p.top().unwrap().function, "big");
    // An equal window (one step) is fine.
    let mut v = example();
    v["step_from"] = 1230.into();
    assert!(parse(v.to_string().as_bytes()).is_ok());
}

#[test]
fn a_peak_or_armed_over_a_limit_is_refused_naming_the_field() {
    let site = example()["sites"][0].clone();
    let frame = json!({"file":"a.py","line":1,"function":"f"});
    let long = "f".repeat(MAX_STR + 1);
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = example();
        f(&mut v);
        v.to_string()
    };
    let cases = [
        (
            edit(&|v| v["sites"] = Value::Array(vec![site.clone(); MAX_SITES + 1])),
            "sites has 21 entries; at most 20",
        ),
        (
            edit(&|v| v["sites"][0]["stack"] = Value::Array(vec![frame.clone(); MAX_STACK + 1])),
            "sites[0].stack has 33 frames",
        ),
        (
            edit(&|v| v["sites"][0]["function"] = long.clone().into()),
            "sites[0].function is 513 bytes",
        ),
        (
            edit(&|v| v["detail"] = long.clone().into()),
            "detail is 513 bytes",
        ),
        (
            edit(&|v| v["peak_bytes"] = (1u64 << 51).into()),
            "peak_bytes = 2251799813685248",
        ),
        (
            edit(&|v| v["peak_bytes"] = "4 GiB".into()),
            "peak_bytes = \"4 GiB\"",
        ),
        (edit(&|v| v["ts"] = 5.into()), "ts = 5"),
        (
            edit(&|v| (v["step_from"], v["step_to"]) = (1230.into(), 1210.into())),
            "step_from = 1230 is after step_to = 1210",
        ),
        (
            edit(&|v| {
                v.as_object_mut()
                    .unwrap()
                    .remove("id")
                    .map(drop)
                    .unwrap_or(())
            }),
            "peak needs \"id\"",
        ),
        (
            json!({"type":"armed","ts":1763700400}).to_string(),
            "armed needs \"id\"",
        ),
        (
            json!({"type":"armed","id":1,"ts":1763700400,"error":"e".repeat(33)}).to_string(),
            "error is 33 bytes",
        ),
    ];
    for (line, needle) in cases {
        let err = parse(line.as_bytes()).unwrap_err();
        assert_eq!(err.code, Code::BadField, "{line}");
        assert!(err.message.contains(needle), "{needle}: {}", err.message);
    }
}
