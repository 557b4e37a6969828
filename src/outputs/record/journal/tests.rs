use super::*;

const HELLO: &str = r#"{"type":"hello","v":1}"#;
const SAMPLE: &str = r#"{"type":"sample","ts":5,"step":1,"stats":{}}"#;

#[test]
fn traces_left_open_are_ended_and_closed_ones_are_not() {
    let d = tempfile::tempdir().unwrap();
    let put = |name: &str, body: &str| std::fs::write(d.path().join(name), body).unwrap();
    put(
        "gpumon-1-s-1-a.trace.jsonl",
        &format!("{HELLO}\n{SAMPLE}\n"),
    );
    // Cut mid-line by the kill.
    put(
        "gpumon-1-s-2-a.trace.jsonl",
        &format!("{HELLO}\n{SAMPLE}\n{{\"type\":\"sam"),
    );
    put(
        "gpumon-1-s-3-a.trace.jsonl",
        &format!("{HELLO}\n{SAMPLE}\n{{\"type\":\"bye\",\"ts\":6}}\n"),
    );
    put(
        "gpumon-1-s-4-a.trace.jsonl",
        &format!("{HELLO}\n{SAMPLE}\n"),
    );
    put("notes.txt", "+gpumon-1-s-4-a.trace.jsonl\n");
    put(
        NAME,
        "+gpumon-1-s-1-a.trace.jsonl\n+gpumon-1-s-2-a.trace.jsonl\n+gpumon-1-s-3-a.trace.jsonl\n+gpumon-1-s-4-a.trace.jsonl\n-gpumon-1-s-4-a.trace.jsonl\n+notes.txt\n",
    );
    let (mut j, ended) = Journal::recover(d.path());
    assert_eq!(ended, 2);
    let read = |name: &str| std::fs::read_to_string(d.path().join(name)).unwrap();
    for name in ["gpumon-1-s-1-a.trace.jsonl", "gpumon-1-s-2-a.trace.jsonl"] {
        let text = read(name);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[1], SAMPLE);
        assert_eq!(
            trace::recorder_line(lines[2].as_bytes()),
            Some(trace::RecorderLine::Ended(KILLED.into()))
        );
    }
    // Said bye, or closed (a crash stays a crash), or not a trace: untouched.
    assert!(read("gpumon-1-s-3-a.trace.jsonl").ends_with("\"ts\":6}\n"));
    assert_eq!(
        read("gpumon-1-s-4-a.trace.jsonl"),
        format!("{HELLO}\n{SAMPLE}\n")
    );
    assert_eq!(read("notes.txt"), "+gpumon-1-s-4-a.trace.jsonl\n");
    // A fresh journal, and a second recovery ends nothing twice.
    assert_eq!(read(NAME), "");
    j.opened("gpumon-2-s-1-a.trace.jsonl");
    j.clean();
    drop(j);
    assert_eq!(Journal::recover(d.path()).1, 0);
}
