use std::sync::atomic::Ordering;

use super::*;

fn stats() -> Arc<RecordStats> {
    Arc::new(RecordStats::new())
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap();
            n != names::MARKER && n != journal::NAME
        })
        .collect();
    v.sort();
    v
}

fn total(dir: &Path) -> u64 {
    files(dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

const HELLO: &[u8] = br#"{"type":"hello","v":1}"#;

#[test]
fn a_trace_is_hello_then_lines_and_rotates_with_hello_first() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Recorder::new(dir.path(), Caps::bytes(100, 10_000), stats()).unwrap();
    let mut t = rec.start("s-1", Some("llama/ft x"), Some(3), 1763700000.5, HELLO);
    assert_eq!(
        t.path().file_name().unwrap().to_str().unwrap(),
        "gpumon-1763700000-s-1-llama_ft_x-r3.trace.jsonl"
    );
    let first = t.path().to_path_buf();
    for i in 0..10 {
        t.write(format!(r#"{{"type":"sample","step":{i}}}"#).as_bytes(), 0);
    }
    drop(t);
    rec.finish();
    assert!(first.exists());
    let parts = files(dir.path());
    assert!(parts.len() >= 3, "{parts:?}");
    let mut samples = Vec::new();
    for p in &parts {
        assert!(
            std::fs::metadata(p).unwrap().len() <= 100,
            "{p:?} over the cap"
        );
        let l = lines(p);
        assert_eq!(l[0], r#"{"type":"hello","v":1}"#, "{p:?} starts with hello");
        samples.extend(l[1..].iter().cloned());
    }
    // Every sample is in exactly one part, in order across parts.
    samples.sort();
    let mut want: Vec<String> = (0..10)
        .map(|i| format!(r#"{{"type":"sample","step":{i}}}"#))
        .collect();
    want.sort();
    assert_eq!(samples, want);
}

#[test]
fn the_directory_stays_under_its_cap_deleting_the_oldest_finished_traces() {
    let dir = tempfile::tempdir().unwrap();
    let st = stats();
    let rec = Recorder::new(dir.path(), Caps::bytes(1_000, 3_000), st.clone()).unwrap();
    let line = [b'x'; 99];
    let keep = rec.start("s-0", None, None, 1.0, b"{}");
    for s in 1..20 {
        let mut t = rec.start(&format!("s-{s}"), None, None, s as f64 + 1.0, HELLO);
        for _ in 0..9 {
            t.write(&line, 0);
        }
    }
    drop(keep);
    rec.finish();
    assert!(total(dir.path()) <= 3_000, "{}", total(dir.path()));
    assert!(dir
        .path()
        .join("gpumon-20-s-19-trainer.trace.jsonl")
        .exists());
    assert!(st.deleted_files.load(Ordering::Relaxed) > 0);
    assert_eq!(st.stopped(Reason::OverCap), 0);
}

/// A flood of short sessions leaves many small traces: the oldest go past `max_files`, also
/// those a daemon before this one left, and a session open past the cap is still recorded.
#[test]
fn the_directory_keeps_at_most_max_files_traces() {
    let dir = tempfile::tempdir().unwrap();
    let st = stats();
    let caps = Caps {
        files: 5,
        ..Caps::bytes(1 << 20, 1 << 30)
    };
    let rec = Recorder::new(dir.path(), caps, st.clone()).unwrap();
    for s in 1..=12 {
        let mut t = rec.start(&format!("s-{s}"), None, None, s as f64, HELLO);
        t.write(br#"{"type":"sample","step":1}"#, 0);
    }
    rec.finish();
    let left: Vec<String> = files(dir.path())
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let want: Vec<String> = (8..=12)
        .map(|s| format!("gpumon-{s}-s-{s}-trainer.trace.jsonl"))
        .collect();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(left, want_sorted);
    assert_eq!(st.deleted_files.load(Ordering::Relaxed), 7);
    // A new daemon with a lower cap prunes what the last one left, oldest first.
    let caps = Caps { files: 2, ..caps };
    let rec = Recorder::new(dir.path(), caps, stats()).unwrap();
    // Six open at once against a cap of two: every one is recorded whole all the same.
    let open: Vec<_> = (20..26)
        .map(|s| {
            let mut t = rec.start(&format!("s-{s}"), None, None, s as f64, HELLO);
            t.write(br#"{"type":"sample","step":1}"#, 0);
            t
        })
        .collect();
    drop(open);
    rec.finish();
    let left = files(dir.path());
    assert_eq!(left.len(), 2, "{left:?}");
    for p in &left {
        assert_eq!(lines(p).len(), 2, "{p:?}");
    }
}

#[test]
fn files_gpumon_did_not_write_are_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let user = [
        "user-data-1.jsonl",
        "gpumon-lookalike.trace.jsonl",
        "notes.txt",
    ];
    for u in user {
        // The look-alike has our name but no hello first: not ours either.
        std::fs::write(dir.path().join(u), vec![b'u'; 2_000]).unwrap();
    }
    let rec = Recorder::new(dir.path(), Caps::bytes(1_000, 3_000), stats()).unwrap();
    for s in 1..10 {
        let mut t = rec.start(&format!("s-{s}"), None, None, s as f64, HELLO);
        for _ in 0..9 {
            t.write(&[b'x'; 99], 0);
        }
    }
    rec.finish();
    for u in user {
        assert_eq!(
            std::fs::read(dir.path().join(u)).unwrap().len(),
            2_000,
            "{u}"
        );
    }
}

#[test]
fn open_traces_count_and_the_writer_crossing_the_cap_is_stopped_with_a_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let st = stats();
    // Four sessions of up to 4,000 bytes each could hold 16,000 bytes against a 6,000 cap.
    let rec = Recorder::new(dir.path(), Caps::bytes(4_000, 6_000), st.clone()).unwrap();
    let mut traces: Vec<Trace> = (0..4)
        .map(|s| rec.start(&format!("s-{s}"), None, None, 1.0, HELLO))
        .collect();
    for _ in 0..30 {
        for t in traces.iter_mut() {
            t.write(&[b'y'; 99], 0);
            t.send();
        }
    }
    drop(traces);
    rec.finish();
    assert!(total(dir.path()) <= 6_000, "{}", total(dir.path()));
    assert!(st.stopped(Reason::OverCap) > 0);
    assert!(st.dropped_lines.load(Ordering::Relaxed) > 0);
    assert_eq!(st.bytes.load(Ordering::Relaxed), total(dir.path()));
}

#[test]
fn a_stopped_trace_ends_with_a_line_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let st = stats();
    // One part fills the whole cap, so nothing finished is ever there to delete.
    let rec = Recorder::new(dir.path(), Caps::bytes(4_000, 4_000), st.clone()).unwrap();
    let mut traces = vec![rec.start("s-0", None, None, 1.0, HELLO)];
    for _ in 0..2_000 {
        if traces.iter().any(|t| t.stopped.load(Ordering::Relaxed)) {
            break;
        }
        for t in traces.iter_mut() {
            t.write(&[b'y'; 99], 0);
            t.send();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop(traces);
    rec.finish();
    assert_eq!(st.stopped(Reason::OverCap), 1);
    let ends: Vec<String> = files(dir.path())
        .iter()
        .filter_map(|p| lines(p).last().cloned())
        .filter(|l| l.contains("trace_truncated"))
        .collect();
    assert_eq!(ends.len(), 1, "{:?}", files(dir.path()));
    assert!(ends[0].contains(r#""reason":"over_cap""#), "{}", ends[0]);
    assert!(total(dir.path()) <= 4_000);
    assert!(st.dropped_lines.load(Ordering::Relaxed) > 0);
}

#[test]
fn traces_of_an_earlier_run_are_pruned_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("gpumon-1-s-1-trainer.trace.jsonl");
    let mut body = HELLO.to_vec();
    body.push(b'\n');
    body.extend(vec![b'z'; 2_000]);
    std::fs::write(&old, &body).unwrap();
    let rec = Recorder::new(dir.path(), Caps::bytes(1_000, 2_500), stats()).unwrap();
    let mut t = rec.start("s-2", None, None, 2.0, HELLO);
    for _ in 0..9 {
        t.write(&[b'x'; 99], 0);
    }
    drop(t);
    rec.finish();
    assert!(!old.exists(), "the earlier run's trace made room");
    assert!(total(dir.path()) <= 2_500);
}

#[test]
fn a_relative_or_empty_dir_and_an_unwritable_one_are_refused() {
    assert!(Recorder::new(Path::new(""), Caps::bytes(4096, 8192), stats()).is_err());
    assert!(Recorder::new(Path::new("traces"), Caps::bytes(4096, 8192), stats()).is_err());
    let st = stats();
    assert!(Recorder::new(
        Path::new("/proc/gpumon-no-such-dir"),
        Caps::bytes(4096, 8192),
        st.clone()
    )
    .is_err());
    assert!(!st.enabled.load(Ordering::Relaxed));
}

#[test]
fn a_full_disk_gives_up_whole_lines_for_the_stop_line_but_never_the_hello() {
    use std::io::Write;
    let mut f = tempfile::tempfile().unwrap();
    let hello = b"{\"type\":\"hello\",\"v\":1}\n";
    f.write_all(hello).unwrap();
    let line = format!("{{\"type\":\"sample\",\"pad\":\"{}\"}}\n", "p".repeat(80));
    for _ in 0..200 {
        f.write_all(line.as_bytes()).unwrap();
    }
    let len = hello.len() as u64 + 200 * line.len() as u64;
    let cut = super::writer::cut_back(&mut f, len, 8192).unwrap();
    // At least 8 KiB off, ending on a line boundary, and no more than one line beyond it.
    assert!(len - cut >= 8192 && len - cut < 8192 + line.len() as u64);
    assert_eq!((cut - hello.len() as u64) % line.len() as u64, 0);
    // A file with little more than its hello: the hello stays whole.
    assert_eq!(
        super::writer::cut_back(&mut f, hello.len() as u64 + 8192, 8192),
        Some(hello.len() as u64)
    );
    assert_eq!(super::writer::cut_back(&mut f, 100, 8192), None);
}

#[test]
fn a_two_line_header_begins_every_part_and_the_thread_counts_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = stats();
    let rec = Recorder::new(dir.path(), Caps::bytes(200, 10_000), s.clone()).unwrap();
    let gpu = crate::core::trace::gpu_line(0, "MIG-1", 1.0);
    let header = [HELLO, b"\n", &gpu].concat();
    let mut t = rec.start("s-1", None, None, 1763700000.5, &header);
    for i in 0..10 {
        t.write(format!(r#"{{"type":"sample","step":{i}}}"#).as_bytes(), 0);
    }
    drop(t);
    rec.finish();
    let parts = files(dir.path());
    assert!(parts.len() >= 2, "{parts:?}");
    for p in &parts {
        let l = lines(p);
        assert_eq!(l[0], r#"{"type":"hello","v":1}"#, "{p:?}");
        assert!(
            l[1].starts_with(r#"{"type":"trace_gpu","gpu":"0""#),
            "{p:?}: {l:?}"
        );
    }
    assert!(s.busy_ns.load(Ordering::Relaxed) > 0);
    assert_eq!(s.queued_bytes.load(Ordering::Relaxed), 0);
}

#[test]
fn a_trace_being_written_is_locked_and_released_when_its_session_ends() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Recorder::new(dir.path(), Caps::bytes(1 << 20, 1 << 30), stats()).unwrap();
    let mut t = rec.start("s-1", Some("ft"), None, 1763700000.0, HELLO);
    t.write(br#"{"type":"sample","step":1}"#, 0);
    let path = t.path().to_path_buf();
    // The recorder thread creates the file: wait for it, then for its lock.
    let deadline = Instant::now() + Duration::from_secs(5);
    let locked = || {
        std::fs::File::open(&path)
            .map(|f| {
                matches!(
                    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared),
                    Err(rustix::io::Errno::WOULDBLOCK)
                )
            })
            .unwrap_or(false)
    };
    while !locked() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(locked(), "a trace being written must be locked");
    drop(t);
    rec.finish();
    let f = std::fs::File::open(&path).unwrap();
    assert!(
        f.try_lock_shared().is_ok(),
        "a finished trace must not stay locked"
    );
}

/// A client's next connection (same `instance`) names its trace before, finished or still open;
/// another client's does not, and later parts of a trace carry no link.
#[test]
fn a_reconnect_s_trace_names_the_one_it_continues() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Recorder::new(dir.path(), Caps::bytes(200, 1 << 20), stats()).unwrap();
    let hello = br#"{"type":"hello","v":1,"instance":"9-aa"}"#;
    let other = br#"{"type":"hello","v":1,"instance":"9-bb"}"#;
    let first = rec.start("s-1", None, None, 1.0, hello);
    let first_name = first
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    // Opened while the first is still open (a hello before the old connection closed).
    let mut second = rec.start("s-2", None, None, 2.0, hello);
    let second_path = second.path().to_path_buf();
    let lone = rec.start("s-3", None, None, 3.0, other);
    let lone_path = lone.path().to_path_buf();
    for i in 0..10 {
        // Past 200 bytes: a second part.
        second.write(format!(r#"{{"type":"sample","step":{i}}}"#).as_bytes(), 0);
    }
    drop((first, second, lone));
    let third = rec.start("s-4", None, None, 4.0, hello);
    let third_path = third.path().to_path_buf();
    drop(third);
    rec.finish();
    let link = |p: &Path| -> Option<String> {
        let l = lines(p);
        let v: serde_json::Value = serde_json::from_str(l.get(1)?).ok()?;
        (v["type"] == "trace_resumes").then(|| v["file"].as_str().unwrap().to_owned())
    };
    assert_eq!(link(&second_path), Some(first_name));
    assert_eq!(link(&lone_path), None);
    // The newest trace of the instance: the second session's last part.
    let part = |p: &PathBuf| -> u32 {
        let name = p.file_name().unwrap().to_str().unwrap();
        name.split(".p")
            .nth(1)
            .and_then(|r| r.split('.').next()?.parse().ok())
            .unwrap_or(0)
    };
    let parts: Vec<PathBuf> = files(dir.path())
        .into_iter()
        .filter(|p| p.to_str().unwrap().contains("-s-2-"))
        .collect();
    assert!(parts.len() >= 2, "{parts:?}");
    for p in parts.iter().filter(|p| part(p) > 0) {
        assert_eq!(link(p), None, "{p:?}");
    }
    let last = parts.iter().max_by_key(|p| part(p)).unwrap();
    assert_eq!(
        link(&third_path).as_deref(),
        last.file_name().unwrap().to_str()
    );
}
