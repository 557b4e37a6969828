//! The record directory is gpumon's alone: other files survive, the bytes of gpumon's traces
//! (open ones included) stay under `record.max_total_bytes`, and a directory that cannot be used
//! leaves the daemon running without recording, visible in /metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::*;

const CAP: u64 = 16_384;

fn config() -> String {
    format!("[record]\nmax_file_bytes = 8192\nmax_total_bytes = {CAP}\n")
}

fn start(dir: &Path) -> Daemon {
    Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec![
            "--record-dir".into(),
            dir.to_str().unwrap().into(),
        ]),
        config: config(),
        ..DaemonOpts::default()
    })
}

/// A connected trainer that got its welcome.
fn trainer(d: &Daemon, job: &str) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(s, r#"{{"type":"hello","v":1,"pid":1,"job":"{job}"}}"#).unwrap();
    let mut welcome = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    s
}

/// `n` samples of about 200 bytes each, in one write.
fn samples(s: &mut UnixStream, from: u64, n: u64) {
    let mut out = String::new();
    for step in from..from + n {
        out.push_str(&format!(
            "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{},\"reserved_bytes.all.current\":{}}},\"pad\":\"{}\"}}\n",
            1_763_700_000 + step,
            1000 + step,
            1 << 30,
            "p".repeat(60),
        ));
    }
    s.write_all(out.as_bytes()).unwrap();
}

fn gpumon_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_str().unwrap().ends_with(".trace.jsonl"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn metric(d: &Daemon, series: &str) -> Option<f64> {
    d.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn user_files_survive_and_open_traces_count_toward_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let user: Vec<String> = (1..=3).map(|i| format!("user-data-{i}.jsonl")).collect();
    for u in &user {
        std::fs::write(dir.path().join(u), vec![b'u'; 10_000]).unwrap();
    }
    let d = start(dir.path());
    assert!(d.log_contains("leaving alone files gpumon did not write"));
    // Six trainers stay connected and each sends far more than the cap allows in all.
    let mut open: Vec<UnixStream> = (0..6).map(|i| trainer(&d, &format!("j{i}"))).collect();
    for round in 0..3 {
        for s in open.iter_mut() {
            samples(s, round * 100, 100);
        }
        // Lines wait at most a second in a session's buffer before the recorder gets them.
        std::thread::sleep(Duration::from_millis(1_100));
    }
    for s in open.iter_mut() {
        samples(s, 1_000, 1);
    }
    d.wait_for(
        Duration::from_secs(5),
        "a session stopped at the cap",
        || {
            metric(
                &d,
                r#"gpumon_record_sessions_stopped_total{reason="over_cap"}"#,
            )
            .is_some_and(|v| v >= 1.0)
        },
    );
    // Still connected: the bound holds with every trace open.
    let on_disk = gpumon_bytes(dir.path());
    assert!(on_disk <= CAP, "{on_disk} bytes of traces against {CAP}");
    assert_eq!(metric(&d, "gpumon_record_enabled"), Some(1.0));
    let reported = metric(&d, "gpumon_record_bytes").unwrap();
    assert!(reported <= CAP as f64, "{reported}");
    assert!(metric(&d, "gpumon_record_dropped_lines_total").unwrap() > 0.0);
    for u in &user {
        let len = std::fs::metadata(dir.path().join(u)).unwrap().len();
        assert_eq!(len, 10_000, "{u} untouched");
    }
    drop(open);
    assert_eq!(d.stop().code(), Some(0));
    assert!(gpumon_bytes(dir.path()) <= CAP);
}

#[test]
fn an_unusable_record_dir_leaves_the_daemon_running_without_recording() {
    // Under /proc nothing can be created, whoever runs the test.
    let d = start(Path::new("/proc/gpumon-no-such-record-dir"));
    assert!(d.log_contains("running without recording"));
    assert_eq!(metric(&d, "gpumon_record_enabled"), Some(0.0));
    let mut s = trainer(&d, "still-served");
    samples(&mut s, 1, 3);
    d.wait_for(Duration::from_secs(5), "the samples accepted", || {
        d.snapshot()["sessions"][0]["samples"].as_u64() == Some(3)
    });
    drop(s);
    assert_eq!(d.stop().code(), Some(0));
}

#[test]
fn a_read_only_record_dir_degrades_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mut perm = std::fs::metadata(&ro).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o555);
    std::fs::set_permissions(&ro, perm).unwrap();
    if std::fs::write(ro.join("probe"), b"x").is_ok() {
        // Root ignores the mode bits: nothing to prove here as root.
        eprintln!("skipped: running as root, a read-only mode does not stop writes");
        return;
    }
    let d = start(&ro);
    assert_eq!(metric(&d, "gpumon_record_enabled"), Some(0.0));
    let mut s = trainer(&d, "still-served");
    samples(&mut s, 1, 1);
    drop(s);
    assert_eq!(d.stop().code(), Some(0));
}

/// p99 of `n` /metrics requests, in milliseconds.
fn metrics_p99(d: &Daemon, n: usize) -> f64 {
    let mut ms: Vec<f64> = (0..n)
        .map(|_| {
            let t = std::time::Instant::now();
            let (code, _) = d.get("/metrics");
            assert_eq!(code, 200);
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[(n * 99 / 100).min(n - 1)]
}

#[test]
fn hellos_with_ten_thousand_traces_in_the_directory_stall_no_scrape_and_no_trainer() {
    let dir = tempfile::tempdir().unwrap();
    // Traces of earlier runs, far over the cap: every new trace makes the recorder delete some.
    for i in 0..10_000u64 {
        std::fs::write(
            dir.path().join(format!(
                "gpumon-{}-s-old{i}-j.trace.jsonl",
                1_700_000_000 + i
            )),
            "{\"type\":\"hello\",\"v\":1,\"job\":\"old\"}\n",
        )
        .unwrap();
    }
    let d = start(dir.path());
    let mut steady = trainer(&d, "steady");
    samples(&mut steady, 0, 1);
    let idle = metrics_p99(&d, 200);
    // Sixty trainers arrive, each hello starting a trace, while scrapes go on and the steady
    // trainer keeps pushing.
    let arrivals = std::thread::spawn({
        let socket = d.socket.clone();
        move || {
            for i in 0..60 {
                let mut s = UnixStream::connect(&socket).unwrap();
                writeln!(s, r#"{{"type":"hello","v":1,"pid":1,"job":"new{i}"}}"#).unwrap();
                let mut welcome = String::new();
                BufReader::new(s.try_clone().unwrap())
                    .read_line(&mut welcome)
                    .unwrap();
                assert!(welcome.contains("welcome"), "{welcome}");
            }
        }
    });
    let busy = metrics_p99(&d, 200);
    // The steady trainer's sample is visible as fast as ever: nothing it needs waits on files.
    let mut visible = Vec::new();
    for step in 1..=20 {
        let t = std::time::Instant::now();
        samples(&mut steady, step, 1);
        d.wait_for(Duration::from_secs(5), "the sample in the API", || {
            let snap = d.snapshot();
            snap["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["job"] == "steady" && s["step"].as_u64() == Some(step))
        });
        visible.push(t.elapsed().as_secs_f64() * 1e3);
    }
    arrivals.join().unwrap();
    visible.sort_by(f64::total_cmp);
    eprintln!(
        "/metrics p99: idle {idle:.2} ms, during hellos {busy:.2} ms; sample→API max {:.1} ms",
        visible[visible.len() - 1]
    );
    // Within 2x of idle; the 5 ms absorb a loaded 2-core machine's scheduling noise, which is
    // far below what a directory walk of 10,000 files under a lock cost.
    assert!(busy <= 2.0 * idle + 5.0, "idle {idle} ms, busy {busy} ms");
    assert!(visible[visible.len() - 1] < 500.0, "{visible:?}");
    // The recorder did its deleting meanwhile, on its own thread.
    d.wait_for(Duration::from_secs(20), "the cap to hold", || {
        metric(&d, "gpumon_record_deleted_files_total").is_some_and(|n| n >= 9_000.0)
    });
}

/// A tmpfs of `kib` KiB mounted on a new directory, unmounted when dropped. None where mounting
/// is not allowed (not root, or no CAP_SYS_ADMIN); scripts/check runs as root and requires it.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(kib: u64) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok && std::env::var_os("GPUMON_REQUIRE_TOOLS").is_some() {
            panic!("cannot mount a tmpfs (GPUMON_REQUIRE_TOOLS is set, so this test cannot be skipped)");
        }
        ok.then_some(Self(dir))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_full_disk_ends_the_trace_with_its_reason_and_analyze_reads_no_crash() {
    let Some(disk) = SmallDisk::mount(64) else {
        eprintln!("skipped: tmpfs cannot be mounted here");
        return;
    };
    let dir = disk.0.path();
    // Caps far above the disk: the disk fills first.
    let d = Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec![
            "--record-dir".into(),
            dir.to_str().unwrap().into(),
        ]),
        config: "[record]\nmax_file_bytes = 1048576\nmax_total_bytes = 1048576\n".into(),
        ..DaemonOpts::default()
    });
    let mut s = trainer(&d, "full-disk");
    let mut step = 0;
    while metric(
        &d,
        "gpumon_record_sessions_stopped_total{reason=\"disk_full\"}",
    ) != Some(1.0)
    {
        assert!(step < 5_000, "the disk never filled");
        samples(&mut s, step, 50);
        step += 50;
        std::thread::sleep(Duration::from_millis(20));
    }
    writeln!(s, r#"{{"type":"bye","ts":1763709999}}"#).unwrap();
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    let trace = recorded_trace(dir);
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.ends_with("\n") && text.lines().last().unwrap().contains("trace_truncated"),
        "the trace ends with its reason: {:?}",
        text.lines().last()
    );
    let (code, v) = analyze_json(&trace);
    let t = &v["traces"][0];
    assert_eq!(t["truncated"], "recording stopped: disk_full", "{t}");
    assert_eq!(code, Some(0), "no crash read into it: {t}");
}
