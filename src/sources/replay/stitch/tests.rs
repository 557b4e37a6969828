use super::*;

fn write(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

#[test]
fn a_file_follows_the_one_it_resumes_when_the_instance_matches() {
    let d = tempfile::tempdir().unwrap();
    let h = r#"{"type":"hello","v":1,"instance":"7-ab"}"#;
    let other = r#"{"type":"hello","v":1,"instance":"8-cd"}"#;
    let a = write(d.path(), "a.trace.jsonl", &[h]);
    let link = r#"{"type":"trace_resumes","file":"a.trace.jsonl","ts":1763700002}"#;
    let b = write(d.path(), "b.trace.jsonl", &[h, link]);
    let link_b = r#"{"type":"trace_resumes","file":"b.trace.jsonl","ts":1763700003}"#;
    let c = write(d.path(), "c.trace.jsonl", &[h, link_b]);
    // Names a file it is not the same client as: read alone.
    let x = write(d.path(), "x.trace.jsonl", &[other, link]);
    let lone = write(d.path(), "lone.trace.jsonl", &[other]);
    let got = runs(vec![
        c.clone(),
        lone.clone(),
        a.clone(),
        b.clone(),
        x.clone(),
    ]);
    assert_eq!(got, vec![vec![lone], vec![a, b, c], vec![x]]);
}
