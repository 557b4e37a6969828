use crate::sources::ingest::protocol::{parse, Code, Message};

const SPLIT: &str = r#""categories":{"step":3,"parameters_bytes":4000,"gradients_bytes":4000,"optimizer_state_bytes":8000,"buffers_bytes":16,"activations_bytes":12000,"batch_size":32"#;

fn sample_with(categories: &str) -> String {
    format!(
        r#"{{"type":"sample","ts":1763700000.0,"step":3,"stats":{{"allocated_bytes.all.peak":30000}},{categories}}}"#
    )
}

fn rejected(line: &str) -> (Code, String) {
    match parse(line.as_bytes()) {
        Err(r) => (r.code, r.message),
        Ok(m) => panic!("accepted {line}: {m:?}"),
    }
}

#[test]
fn a_split_is_parsed_with_its_batch_fp32_and_partial_reasons() {
    let line = sample_with(&format!(
        r#"{SPLIT},"fp32_bytes":8000,"partial":["dtensor_local: local shards"],"newer_figure":1}}"#
    ));
    let Ok(Message::Sample(s)) = parse(line.as_bytes()) else {
        panic!("not a sample: {line}");
    };
    let c = s.categories.expect("categories");
    assert_eq!(c.step, 3);
    assert_eq!(c.parameters_bytes, 4000);
    assert_eq!(c.optimizer_state_bytes, 8000);
    assert_eq!(c.activations_bytes, 12000);
    assert_eq!(c.batch_size, Some(32));
    assert_eq!(c.fp32_bytes, Some(8000));
    assert_eq!(c.partial, vec!["dtensor_local: local shards".to_string()]);
    assert!(c.partial_has("dtensor_local"));
}

#[test]
fn a_sample_without_a_split_has_none_and_a_null_batch_is_unknown() {
    let Ok(Message::Sample(s)) = parse(br#"{"type":"sample","ts":1763700000.0}"#) else {
        panic!("not a sample");
    };
    assert!(s.categories.is_none());
    let line = sample_with(&SPLIT.replace(r#""batch_size":32"#, r#""batch_size":null}"#));
    let Ok(Message::Sample(s)) = parse(line.as_bytes()) else {
        panic!("not a sample: {line}");
    };
    assert_eq!(s.categories.expect("categories").batch_size, None);
}

#[test]
fn a_bad_figure_is_refused_naming_it() {
    for (bad, names) in [
        (r#""categories":[1,2]"#, "categories = [1,2]"),
        (
            &SPLIT.replace("\"activations_bytes\":12000,", "")[..],
            "\"activations_bytes\"",
        ),
        (
            &SPLIT.replace("12000", "-5")[..],
            "categories.activations_bytes = -5",
        ),
        (
            &SPLIT.replace("\"gradients_bytes\":4000", "\"gradients_bytes\":\"4k\"")[..],
            "categories.gradients_bytes = \"4k\"",
        ),
        (
            &SPLIT.replace("4000,\"gradients", "2251799813685249,\"gradients")[..],
            "categories.parameters_bytes = 2251799813685249",
        ),
        (
            &SPLIT.replace("\"batch_size\":32", "\"batch_size\":2.5")[..],
            "categories.batch_size = 2.5",
        ),
        (&SPLIT.replace("\"step\":3,", "")[..], "\"step\""),
    ] {
        let line = match bad.strip_prefix("\"categories\":[") {
            Some(_) => sample_with(bad),
            None => sample_with(&format!("{bad}}}")),
        };
        let (code, message) = rejected(&line);
        assert_eq!(code, Code::BadField, "{line}");
        assert!(message.contains(names), "{message:?} should name {names}");
    }
}

#[test]
fn partial_reasons_are_bounded_in_count_and_length() {
    let many = vec!["\"x\""; 17].join(",");
    let (code, message) = rejected(&sample_with(&format!(r#"{SPLIT},"partial":[{many}]}}"#)));
    assert_eq!(code, Code::BadField);
    assert!(message.contains("17 reasons"), "{message}");
    let long = "y".repeat(513);
    let (_, message) = rejected(&sample_with(&format!(r#"{SPLIT},"partial":["{long}"]}}"#)));
    assert!(message.contains("categories.partial[0]"), "{message}");
    let (_, message) = rejected(&sample_with(&format!(r#"{SPLIT},"partial":[7]}}"#)));
    assert!(message.contains("categories.partial[0] = 7"), "{message}");
}

#[test]
fn a_batch_past_what_the_fit_answers_is_refused_naming_the_bound() {
    // 2^24 is the most the batch fit answers: a larger batch would be answered with a smaller one.
    let ok = sample_with(&format!(
        "{}}}",
        SPLIT.replace("\"batch_size\":32", "\"batch_size\":16777216")
    ));
    assert!(parse(ok.as_bytes()).is_ok(), "{ok}");
    let line = sample_with(&format!(
        "{}}}",
        SPLIT.replace("\"batch_size\":32", "\"batch_size\":16777217")
    ));
    let (code, message) = rejected(&line);
    assert_eq!(code, Code::BadField);
    assert!(
        message.contains("categories.batch_size = 16777217") && message.contains("2^24"),
        "{message}"
    );
}

#[test]
fn fp32_bytes_above_parameters_and_gradients_is_refused_naming_both() {
    // Parameters 4000 + gradients 4000: 8000 float32 bytes at most.
    let ok = sample_with(&format!(r#"{SPLIT},"fp32_bytes":8000}}"#));
    assert!(parse(ok.as_bytes()).is_ok(), "{ok}");
    let (code, message) = rejected(&sample_with(&format!(r#"{SPLIT},"fp32_bytes":8001}}"#)));
    assert_eq!(code, Code::BadField);
    assert!(
        message.contains("categories.fp32_bytes is 8001")
            && message.contains("parameters_bytes + gradients_bytes (8000)"),
        "{message}"
    );
    // A 0-byte model (parameters not on this device) has no float32 bytes to halve.
    let zero = SPLIT
        .replace("\"parameters_bytes\":4000", "\"parameters_bytes\":0")
        .replace("\"gradients_bytes\":4000", "\"gradients_bytes\":0");
    let (_, message) = rejected(&sample_with(&format!(
        r#"{zero},"fp32_bytes":1125899906842624}}"#
    )));
    assert!(
        message.contains("categories.fp32_bytes is 1125899906842624"),
        "{message}"
    );
}
