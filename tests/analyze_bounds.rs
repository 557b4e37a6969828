//! `gpumon analyze` given what costs more than it weighs: a line gigabytes long in a sparse
//! file (a few KB on disk), recorder lines with values out of range, paths that are no trace
//! (a symlink loop, a fifo, a link to /dev/zero). Each is named; memory stays bounded and
//! nothing blocks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpumon");
const GIB: u64 = 1 << 30;
const TOTAL: u64 = 85_520_809_984;
const T0: u64 = 1_763_700_000;

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `gpumon analyze ARGS` with its address space capped at `limit` bytes (so a buffer
/// that grows with its input fails the run), killed past a generous deadline: a run that
/// blocks or spins fails the test instead of hanging it.
fn analyze(args: &[&str], limit: u64) -> Ran {
    let mut cmd = Command::new(BIN);
    cmd.arg("analyze")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches only the struct passed.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpumon analyze {args:?} did not finish in 180 s: it blocks or spins");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn sample(f: &mut impl Write, step: u64) {
    let floor = 20 * GIB;
    writeln!(
        f,
        r#"{{"type":"sample","ts":{},"step":{step},"stats":{{"allocated_bytes.all.current":{floor},"allocated_bytes.all.peak":{},"reserved_bytes.all.current":{}}},"device_free":{},"device_total":{TOTAL}}}"#,
        T0 + step,
        floor + GIB,
        floor + 2 * GIB,
        TOTAL - floor - 3 * GIB
    )
    .unwrap();
}

fn hello(f: &mut impl Write) {
    writeln!(
        f,
        r#"{{"type":"hello","v":1,"pid":1,"job":"bounds","rank":0}}"#
    )
    .unwrap();
}

fn trace_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(name)).unwrap()
}

#[test]
fn a_line_gigabytes_long_is_skipped_in_bounded_memory_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.jsonl");
    let mut f = trace_file(dir.path(), "long.jsonl");
    hello(&mut f);
    sample(&mut f, 0);
    // Line 3: 2 GiB of NUL bytes and no newline, a hole in the file (nothing on disk).
    let start = f.stream_position().unwrap();
    let long = 2 * GIB;
    f.set_len(start + long).unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"\n").unwrap();
    for step in 1..4 {
        sample(&mut f, step);
    }
    writeln!(f, r#"{{"type":"bye","ts":{}}}"#, T0 + 10).unwrap();
    drop(f);
    // 512 MiB of address space: a quarter of the line.
    let ran = analyze(&[path.to_str().unwrap()], 512 << 20);
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout
            .contains(&format!("line 3: line of {long} bytes exceeds")),
        "{}",
        ran.stdout
    );
    assert!(ran.stdout.contains("65536"), "{}", ran.stdout);
    // The lines after it are read: four samples in all.
    assert!(ran.stdout.contains("4 samples"), "{}", ran.stdout);
}

#[test]
fn recorder_line_values_out_of_range_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ranges.jsonl");
    let mut f = trace_file(dir.path(), "ranges.jsonl");
    hello(&mut f);
    let bad = [
        r#"{"type":"trace_gpu","gpu":"4294967296","gpu_uuid":"GPU-1","ts":1763700000.0}"#,
        r#"{"type":"trace_host","host":"n1","ts":1e300}"#,
        r#"{"type":"trace_nvml","used_bytes":18446744073709551615,"ts":1763700001.0}"#,
        r#"{"type":"trace_nvml","used_bytes":1024,"ts":-5}"#,
        r#"{"type":"trace_resumes","file":"a.jsonl","ts":-1}"#,
        r#"{"type":"trace_truncated","reason":"disk_full","ts":"soon"}"#,
    ];
    for line in bad {
        writeln!(f, "{line}").unwrap();
    }
    for step in 0..5 {
        sample(&mut f, step);
    }
    // A trainer line the protocol refuses for its ts: it moves no clock either.
    writeln!(
        f,
        r#"{{"type":"sample","ts":-1e308,"step":5,"stats":{{"allocated_bytes.all.current":1}}}}"#
    )
    .unwrap();
    writeln!(f, r#"{{"type":"trace_closed","ts":-1e308}}"#).unwrap();
    drop(f);
    let ran = analyze(&["--format", "json", path.to_str().unwrap()], 4 * GIB);
    let v: serde_json::Value = serde_json::from_str(&ran.stdout).expect(&ran.stderr);
    let t = &v["traces"][0];
    let lines: Vec<&str> = t["bad_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let has = |n: u64, what: &[&str]| {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("line {n}: ")))
            .unwrap_or_else(|| panic!("no bad line {n} in {lines:#?}"));
        for w in what {
            assert!(line.contains(w), "line {n} lacks {w:?}: {line}");
        }
    };
    has(2, &["trace_gpu", "gpu", "4294967296", "GPU index"]);
    has(3, &["trace_host", "ts", "1e+300", "Unix time"]);
    has(
        4,
        &["trace_nvml", "used_bytes", "18446744073709551615", "2^50"],
    );
    has(5, &["trace_nvml", "ts", "-5", "Unix time"]);
    has(6, &["trace_resumes", "ts", "-1", "Unix time"]);
    has(7, &["trace_truncated", "ts", "soon"]);
    has(13, &["ts = -1e308"]);
    has(14, &["trace_closed", "ts", "-1e+308", "Unix time"]);
    assert_eq!(t["bad_line_count"], 8, "{lines:#?}");
    // The refused truncation does not stop the crash being read; it is dated by the last
    // good line, not by -1e308.
    let crash = t["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "crash")
        .unwrap_or_else(|| panic!("no crash in {t:#}"));
    let ts = crash["first_ts"].as_f64().unwrap();
    assert!((T0 as f64..T0 as f64 + 10.0).contains(&ts), "crash at {ts}");
    assert!(t["truncated"].is_null(), "{t:#}");
    // The text names each value, and no 300-digit number reaches it.
    let text = analyze(&[path.to_str().unwrap()], 4 * GIB);
    assert!(text.stdout.contains("ranges.jsonl"), "{}", text.stdout);
    assert!(
        !text.stdout.contains("0000000000000000000000000000000"),
        "{}",
        text.stdout
    );
}

/// A trace directory holding what no trace is: a symlink loop, a fifo with no writer, a link
/// to /dev/zero, a link to nothing, beside a good trace.
#[test]
fn unreadable_paths_are_named_as_unreadable_and_never_block() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut good = trace_file(d, "good.jsonl");
    hello(&mut good);
    for step in 0..3 {
        sample(&mut good, step);
    }
    writeln!(good, r#"{{"type":"bye","ts":{}}}"#, T0 + 10).unwrap();
    drop(good);
    std::os::unix::fs::symlink("loop.jsonl", d.join("loop.jsonl")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("zero.jsonl")).unwrap();
    std::os::unix::fs::symlink("gone", d.join("dangling.jsonl")).unwrap();
    let fifo = std::ffi::CString::new(d.join("fifo.jsonl").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads only the NUL-terminated path given.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let s = |name: &str| d.join(name).to_str().unwrap().to_string();
    let expect = [
        ("loop.jsonl", "symbolic links"),
        ("zero.jsonl", "not a regular file (a character device)"),
        ("dangling.jsonl", "No such file"),
        ("fifo.jsonl", "not a regular file (a fifo)"),
    ];
    // The directory, then each path given on its own.
    let whole = analyze(&[d.to_str().unwrap()], 4 * GIB);
    assert_eq!(whole.code, Some(2), "{}\n{}", whole.stdout, whole.stderr);
    assert!(whole.stdout.contains("3 samples"), "{}", whole.stdout);
    for (name, why) in expect {
        let line = whole
            .stderr
            .lines()
            .find(|l| l.contains(&s(name)))
            .unwrap_or_else(|| panic!("{name} not named in {}", whole.stderr));
        assert!(line.contains("unreadable") && line.contains(why), "{line}");
        let alone = analyze(&[&s(name), &s("good.jsonl")], 4 * GIB);
        assert_eq!(alone.code, Some(2), "{name}: {}", alone.stderr);
        assert!(
            alone.stderr.contains(&s(name)) && alone.stderr.contains(why),
            "{name}: {}",
            alone.stderr
        );
        assert!(alone.stdout.contains("3 samples"), "{}", alone.stdout);
    }
}
