//! The memory split's `partial` codes are a string contract with the Python client: one table,
//! `tests/fixtures/partial_split_codes.json` at the repository root, which the client's test
//! (clients/python/tests/test_partial_codes.py) checks its codes against. Here each code must do
//! what the table says in the daemon's rules, so renaming one in `Categories` fails this test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use gpumon_core::core::categories::Categories;
use serde_json::Value;

struct Row {
    code: String,
    sharded: bool,
    activations_unknown: bool,
}

fn table() -> Vec<Row> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/partial_split_codes.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Value = serde_json::from_str(&text).unwrap();
    let rows = doc["codes"].as_array().expect("a `codes` list");
    rows.iter()
        .map(|r| Row {
            code: r["code"].as_str().expect("code").to_string(),
            sharded: r["sharded"].as_bool().expect("sharded"),
            activations_unknown: r["activations_unknown"]
                .as_bool()
                .expect("activations_unknown"),
        })
        .collect()
}

fn split(partial: &[&str]) -> Categories {
    const GIB: u64 = 1 << 30;
    Categories {
        step: 3,
        parameters_bytes: GIB,
        gradients_bytes: GIB,
        optimizer_state_bytes: 2 * GIB,
        buffers_bytes: 0,
        activations_bytes: GIB,
        batch_size: Some(8),
        fp32_bytes: Some(2 * GIB),
        partial: partial.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn every_code_in_the_table_does_what_the_table_says() {
    let rows = table();
    assert!(rows.len() >= 7, "{} codes", rows.len());
    for row in &rows {
        // As the client sends it: the code, then why.
        let c = split(&[&format!("{}: said by the client", row.code)]);
        assert!(c.partial_has(&row.code), "{}", row.code);
        assert_eq!(c.sharded(), row.sharded, "{}: sharded", row.code);
        assert_eq!(
            c.activations_known(),
            !row.activations_unknown,
            "{}: activations known",
            row.code
        );
    }
}

#[test]
fn a_split_without_a_known_code_is_whole() {
    // The other side of the test above: the rules answer from the codes, not always the same.
    for partial in [
        &[][..],
        &["not_a_code: anything"][..],
        &["sharded: a word, not a code"][..],
    ] {
        let c = split(partial);
        assert!(!c.sharded() && c.activations_known(), "{partial:?}");
    }
    let rows = table();
    let sharded = rows.iter().filter(|r| r.sharded).count();
    let unknown = rows.iter().filter(|r| r.activations_unknown).count();
    assert!(
        sharded >= 1 && unknown >= 1,
        "the table exercises both rules"
    );
}

#[test]
fn the_table_has_each_code_once() {
    let rows = table();
    let mut codes: Vec<&str> = rows.iter().map(|r| r.code.as_str()).collect();
    codes.sort_unstable();
    let n = codes.len();
    codes.dedup();
    assert_eq!(codes.len(), n, "a code listed twice");
    assert!(
        codes
            .iter()
            .all(|c| !c.is_empty() && !c.contains(':') && c.trim() == *c),
        "{codes:?}"
    );
}
