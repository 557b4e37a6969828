//! Lossless restarts (capability `ack`): 64 real Python clients at 100 samples/s each push to a
//! recording daemon that is stopped with SIGTERM, killed with SIGKILL, and frozen with SIGSTOP
//! then killed, and restarted each time on the same socket and record directory. Counted from
//! the trace files: every step's sample of every client is in some trace (resends after a
//! restart may put one in two), or the client reported it as given up, and the same for every
//! line it numbered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fake_lib, scenario, BIN};

const TRAINERS: usize = 64;
const HZ: u32 = 100;

struct Daemon(Child);

impl Daemon {
    fn start(socket: &Path, record: &Path, config: &Path) -> Self {
        let child = Command::new(BIN)
            .arg("--config")
            .arg(config)
            .args(["daemon", "--listen", "127.0.0.1:0", "--interval", "1s"])
            .arg("--nvml-lib")
            .arg(fake_lib())
            .arg("--socket")
            .arg(socket)
            .arg("--record-dir")
            .arg(record)
            .env("FAKE_NVML_SCENARIO", scenario("two_gpus"))
            .env("GPUMON_LOG_LEVEL", "warn")
            .env_remove("GPUMON_LISTEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn gpumon");
        let start = Instant::now();
        // Ready once the socket accepts (it is announced only after the signal handlers).
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self(child)
    }

    fn signal(&self, sig: i32) {
        unsafe {
            libc::kill(self.0.id() as i32, sig);
        }
    }

    fn wait(mut self, within: Duration) {
        let start = Instant::now();
        while self.0.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < within, "daemon did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What the traces hold of each client instance.
#[derive(Default)]
struct Traced {
    /// The `seq` numbers found.
    seqs: BTreeSet<u64>,
    /// The steps of the samples found.
    steps: BTreeSet<u64>,
}

/// Per client instance, what the traces hold, and how many lines were found twice (a resend
/// after a restart, of a line the killed daemon had written but not yet acknowledged).
fn traced(dir: &Path) -> (HashMap<String, Traced>, usize) {
    let mut seqs: HashMap<String, Traced> = HashMap::new();
    let mut twice = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".trace.jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        let hello: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        let instance = hello["instance"].as_str().unwrap().to_owned();
        let set = seqs.entry(instance).or_default();
        for line in lines {
            // A daemon killed mid-write may leave half a line last; it was not acknowledged.
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let Some(seq) = v["seq"].as_u64() {
                if !set.seqs.insert(seq) {
                    twice += 1;
                }
            }
            if v["type"] == "sample" {
                set.steps
                    .insert(v["step"].as_u64().expect("a sample with its step"));
            }
        }
    }
    (seqs, twice)
}

#[test]
fn sigterm_sigkill_and_sigstop_lose_no_sample() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ingest.sock");
    let record = dir.path().join("traces");
    let config = dir.path().join("gpumon.toml");
    std::fs::write(&config, "").unwrap();
    let (stop, out) = (dir.path().join("stop"), dir.path().join("report.json"));
    let mut daemon = Daemon::start(&socket, &record, &config);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/lossless/load.py");
    let mut load = Command::new("python3")
        .arg(&script)
        .arg(&socket)
        .arg(TRAINERS.to_string())
        .arg(HZ.to_string())
        .arg(&stop)
        .arg(&out)
        .spawn()
        .expect("python3");
    let pause = || std::thread::sleep(Duration::from_secs(2));
    pause();
    // A clean stop: whatever the daemon had not read yet goes to the next one.
    daemon.signal(libc::SIGTERM);
    daemon.wait(Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    daemon = Daemon::start(&socket, &record, &config);
    pause();
    // Killed: lines applied but not yet written to a trace were never acknowledged.
    daemon.signal(libc::SIGKILL);
    daemon.wait(Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(500));
    daemon = Daemon::start(&socket, &record, &config);
    pause();
    // Frozen, then killed: the socket buffers fill and are lost with it.
    daemon.signal(libc::SIGSTOP);
    pause();
    daemon.signal(libc::SIGKILL);
    daemon.wait(Duration::from_secs(5));
    daemon = Daemon::start(&socket, &record, &config);
    pause();
    std::fs::write(&stop, "").unwrap();
    let status = load.wait().unwrap();
    assert!(status.success(), "the load script failed");
    daemon.signal(libc::SIGTERM);
    daemon.wait(Duration::from_secs(10));

    let report: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(report.len(), TRAINERS);
    let (seqs, twice) = traced(&record);
    let (mut lost, mut given_up, mut resent, mut lines) = (0, 0, 0, 0);
    let (mut samples, mut samples_lost) = (0, 0);
    for r in &report {
        let last = r["last_seq"].as_u64().unwrap();
        let have = seqs.get(r["instance"].as_str().unwrap());
        let missing = (1..=last)
            .filter(|s| !have.is_some_and(|h| h.seqs.contains(s)))
            .count() as u64;
        let reported = r["dropped"].as_u64().unwrap() + r["unconfirmed"].as_u64().unwrap();
        assert!(
            missing <= reported,
            "{r}: {missing} numbered line(s) are in no trace, {reported} reported given up"
        );
        // Samples, whether or not they were ever numbered: one per step, each in a trace or
        // counted by the client (dropped from its queue, forgotten unacknowledged, or held back
        // under the daemon's rate limit).
        let steps = r["steps"].as_u64().unwrap();
        let gone = (1..=steps)
            .filter(|s| !have.is_some_and(|h| h.steps.contains(s)))
            .count() as u64;
        let counted = reported + r["rate_skipped"].as_u64().unwrap();
        assert!(
            gone <= counted,
            "{r}: {gone} sample(s) are in no trace, {counted} counted by the client"
        );
        // The load really ran at 100 Hz (a slow machine would prove less than it says).
        let rate = steps as f64 / r["seconds"].as_f64().unwrap();
        assert!(
            rate >= 0.9 * f64::from(HZ),
            "{r}: {rate:.0} steps/s, not {HZ}"
        );
        samples += steps;
        samples_lost += gone;
        assert!(
            r["connects"].as_u64().unwrap() >= 4,
            "{r}: one connection per daemon"
        );
        lost += missing;
        given_up += reported;
        resent += r["resent"].as_u64().unwrap();
        lines += last;
    }
    eprintln!(
        "{TRAINERS} trainers, {samples} samples ({samples_lost} in no trace), {lines} numbered lines: {lost} in no trace, {given_up} reported given up, {resent} resent, {twice} in two traces"
    );
    assert_eq!(lost, 0, "no line lost");
    assert_eq!(samples_lost, 0, "no sample lost");
    assert!(
        resent > 0,
        "the restarts cost unacknowledged lines that had to go again"
    );
}
