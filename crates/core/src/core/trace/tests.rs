use super::*;

#[test]
fn recorder_lines_read_back_and_protocol_lines_are_left_alone() {
    const T: f64 = 1_763_700_000.0;
    let t = truncated_line("disk_full", T + 1.0);
    assert_eq!(
        recorder_line(t.strip_suffix(b"\n").unwrap()),
        Some(RecorderLine::Truncated("disk_full".into()))
    );
    let e = ended_line(DAEMON_STOPPED, T + 3.0);
    assert_eq!(
        recorder_line(&e),
        Some(RecorderLine::Ended("daemon_stopped".into()))
    );
    let r = resumes_line("gpumon-1-s-1-job.trace.jsonl", T + 4.0);
    assert_eq!(
        recorder_line(r.strip_suffix(b"\n").unwrap()),
        Some(RecorderLine::Resumes("gpumon-1-s-1-job.trace.jsonl".into()))
    );
    assert_eq!(
        hello_instance(br#"{"type":"hello","v":1,"instance":"42-ab"}"#).as_deref(),
        Some("42-ab")
    );
    assert_eq!(hello_instance(br#"{"type":"hello","v":1}"#), None);
    let g = gpu_line(3, "MIG-1", T + 2.0);
    assert_eq!(recorder_line(&g), Some(RecorderLine::Gpu(3)));
    // A trainer's event whose detail mentions the marker is still a protocol line.
    let e = br#"{"type":"event","ts":1,"kind":"x","detail":"\"trace_gpu\""}"#;
    assert_eq!(recorder_line(e), None);
    assert!(is_hello(br#"{"type":"hello","v":1}"#));
    assert!(!is_hello(br#"{"type":"sample"}"#));
    assert!(!is_hello(b"not json"));
}

#[test]
fn recorder_values_out_of_range_are_named_with_what_is_valid() {
    let err = |line: &str| match read_recorder_line(line.as_bytes()) {
        Some(Err(e)) => e,
        other => panic!("{line}: {other:?}"),
    };
    let e = err(r#"{"type":"trace_closed","ts":-1e308}"#);
    assert!(
        e.contains("trace_closed: ts = -1e+308") && e.contains("2000 to 2100"),
        "{e}"
    );
    let e = err(r#"{"type":"trace_nvml","used_bytes":-1,"ts":1763700000}"#);
    assert!(e.contains("used_bytes = -1") && e.contains("2^50"), "{e}");
    let e = err(r#"{"type":"trace_gpu","gpu":"-1","gpu_uuid":"x"}"#);
    assert!(e.contains("gpu = \"-1\" is not a GPU index"), "{e}");
    let e = err(r#"{"type":"trace_closed"}"#);
    assert!(e.contains("trace_closed needs \"ts\""), "{e}");
    // A long value is cut, not echoed whole.
    let e = err(&format!(
        r#"{{"type":"trace_host","host":"h","ts":"{}"}}"#,
        "9".repeat(5000)
    ));
    assert!(e.len() < 200, "{e}");
    // The edges of the range: the first second of 2000 is taken, 2100 is not.
    assert_eq!(
        recorder_line(br#"{"type":"trace_closed","ts":946684800}"#),
        Some(RecorderLine::Closed(946_684_800.0))
    );
    assert!(matches!(
        read_recorder_line(br#"{"type":"trace_closed","ts":4102444800}"#),
        Some(Err(_))
    ));
    // A type the recorder does not write is the protocol's to refuse.
    assert_eq!(
        read_recorder_line(br#"{"type":"trace_other","ts":-1}"#),
        None
    );
}

/// `trace_unified` reads back what `unified::line` writes; a figure out of range, one alone, or a
/// free above the total is named, not taken.
#[test]
fn unified_lines_read_back_and_bad_figures_are_named() {
    use crate::core::unified::{line, Room};
    let room = Room {
        free: 300 << 20,
        total: 24 << 30,
    };
    let mut last = None;
    let l = line(Some(room), &mut last).unwrap();
    assert_eq!(recorder_line(&l), Some(RecorderLine::Unified(Some(room))));
    assert_eq!(
        line(Some(room), &mut last),
        None,
        "unchanged: not noted again"
    );
    let gone = line(None, &mut last).unwrap();
    assert_eq!(recorder_line(&gone), Some(RecorderLine::Unified(None)));
    let err = |text: &str| match read_recorder_line(text.as_bytes()) {
        Some(Err(e)) => e,
        other => panic!("{text}: {other:?}"),
    };
    let e = err(r#"{"type":"trace_unified","free_bytes":-1,"total_bytes":5}"#);
    assert!(e.contains("free_bytes = -1") && e.contains("2^50"), "{e}");
    let e = err(r#"{"type":"trace_unified","free_bytes":5}"#);
    assert!(e.contains("must both be given"), "{e}");
    let e = err(r#"{"type":"trace_unified","free_bytes":6,"total_bytes":5}"#);
    assert!(e.contains("the free at most the total"), "{e}");
}
