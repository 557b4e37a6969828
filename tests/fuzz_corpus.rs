//! Replays the kept fuzz corpus (fuzz/corpus/<target>/) and the inputs of bugs the fuzzer found
//! (fuzz/regressions/<target>/) through the very checks the fuzz targets run (fuzz/src/), on the
//! stable toolchain: every input the fuzzer found interesting stays a regression test without
//! nightly or cargo-fuzz.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../fuzz/src/conn.rs"]
mod conn;
#[path = "../fuzz/src/lines.rs"]
mod lines;
#[path = "../fuzz/src/parse.rs"]
mod parse;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn replay(target: &str, check: fn(&[u8])) {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let corpus = inputs(&fuzz.join("corpus").join(target));
    // An emptied corpus would make this test pass without checking anything.
    assert!(corpus.len() >= 20, "{target}: only {} inputs", corpus.len());
    let regressions = fuzz.join("regressions").join(target);
    let mut paths = corpus;
    if regressions.exists() {
        paths.extend(inputs(&regressions));
    }
    let failed: Vec<String> = paths
        .iter()
        .filter(|p| {
            let data = std::fs::read(p).unwrap();
            catch_unwind(AssertUnwindSafe(|| check(&data))).is_err()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{target} fails on: {failed:#?}");
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths
}

#[test]
fn parse_corpus() {
    replay("parse", parse::check);
}

#[test]
fn conn_corpus() {
    replay("conn", conn::check);
}

#[test]
fn lines_corpus() {
    replay("lines", lines::check);
}
