//! The labeled corpus (corpus/generate.py, deterministic) through the real `gpumon analyze`,
//! scored by corpus/evaluate.py: every leak caught early enough, no healthy run flagged, the OOM
//! forecast close to the real OOM, near_limit on the near-limit runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn analyze_meets_the_numbers_on_the_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let gen = Command::new("python3")
        .arg(root().join("corpus/generate.py"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        gen.status.success(),
        "{}",
        String::from_utf8_lossy(&gen.stderr)
    );
    let mut traces: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    traces.sort();
    assert!(traces.len() >= 80, "{} traces", traces.len());
    let out = Command::new(BIN)
        .args(["analyze", "--format", "json"])
        .args(&traces)
        .output()
        .unwrap();
    // Leaks are in the corpus, so findings are expected: exit status 1.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = dir.path().join("analyze.json");
    std::fs::write(&json, &out.stdout).unwrap();
    let eval = Command::new("python3")
        .arg(root().join("corpus/evaluate.py"))
        // detection.md's forecast is linear; a leak that accelerates later is reported, not met.
        .args(["--known-forecast-limit", "leak_accelerating"])
        .arg(dir.path().join("labels.json"))
        .arg(&json)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&eval.stdout);
    println!("{table}");
    assert!(eval.status.success(), "corpus criteria not met:\n{table}");
}
