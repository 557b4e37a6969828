use super::*;

#[test]
fn recorder_lines_read_back_and_protocol_lines_are_left_alone() {
    let t = truncated_line("disk_full", 1.0);
    assert_eq!(
        recorder_line(t.strip_suffix(b"\n").unwrap()),
        Some(RecorderLine::Truncated("disk_full".into()))
    );
    let e = ended_line(DAEMON_STOPPED, 3.0);
    assert_eq!(
        recorder_line(&e),
        Some(RecorderLine::Ended("daemon_stopped".into()))
    );
    let r = resumes_line("gpumon-1-s-1-job.trace.jsonl", 4.0);
    assert_eq!(
        recorder_line(r.strip_suffix(b"\n").unwrap()),
        Some(RecorderLine::Resumes("gpumon-1-s-1-job.trace.jsonl".into()))
    );
    assert_eq!(
        hello_instance(br#"{"type":"hello","v":1,"instance":"42-ab"}"#).as_deref(),
        Some("42-ab")
    );
    assert_eq!(hello_instance(br#"{"type":"hello","v":1}"#), None);
    let g = gpu_line(3, "MIG-1", 2.0);
    assert_eq!(recorder_line(&g), Some(RecorderLine::Gpu(3)));
    // A trainer's event whose detail mentions the marker is still a protocol line.
    let e = br#"{"type":"event","ts":1,"kind":"x","detail":"\"trace_gpu\""}"#;
    assert_eq!(recorder_line(e), None);
    assert!(is_hello(br#"{"type":"hello","v":1}"#));
    assert!(!is_hello(br#"{"type":"sample"}"#));
    assert!(!is_hello(b"not json"));
}
