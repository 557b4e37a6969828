//! The memory ledger against the fake NVML and the real socket: NVML's per-process figure for a
//! trainer's process split into live tensors, the allocator's cache and memory outside the
//! allocator, in the API and in /metrics; and what makes a part unknowable said, not guessed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";
const GPU1: &str = "GPU-66666666-7777-8888-9999-000000000000";
const GIB: u64 = 1 << 30;

fn trainer(d: &Daemon, rank: u32, gpu: &str, allocated: u64, reserved: u64) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    writeln!(
        s,
        r#"{{"type":"hello","v":1,"pid":7,"job":"ledger","rank":{rank},"gpu_uuid":"{gpu}"}}"#
    )
    .unwrap();
    let mut welcome = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    writeln!(
        s,
        r#"{{"type":"sample","ts":{now},"step":1,"stats":{{"allocated_bytes.all.current":{allocated},"reserved_bytes.all.current":{reserved},"inactive_split_bytes.all.current":{}}}}}"#,
        GIB / 4
    )
    .unwrap();
    s
}

fn ledger_of(d: &Daemon, rank: u64) -> serde_json::Value {
    d.snapshot()["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["rank"] == rank)
        .map(|s| s["ledger"].clone())
        .unwrap_or_default()
}

#[test]
fn nvml_s_figure_is_split_into_tensors_cache_and_memory_outside_the_allocator() {
    // The test process is the trainer: the fake NVML lists it on GPU 1 with 3 GiB used.
    let me = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    let mut scen = std::fs::read_to_string(scenario("two_gpus")).unwrap();
    scen.push_str(&format!(
        "\n[[gpu.process]]\npid = {me}\nname = \"python\"\nused = {}\n",
        3 * GIB
    ));
    let path = dir.path().join("with_me.toml");
    std::fs::write(&path, scen).unwrap();
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&path),
        ..DaemonOpts::default()
    });
    let _a = trainer(&d, 1, GPU1, GIB, 2 * GIB);
    d.wait_for(Duration::from_secs(5), "the ledger", || {
        ledger_of(&d, 1)["outside_allocator_bytes"].is_u64()
    });
    let l = ledger_of(&d, 1);
    assert_eq!(l["nvml_used_bytes"], 3 * GIB, "{l}");
    assert_eq!(l["allocated_bytes"], GIB);
    assert_eq!(l["cached_bytes"], GIB);
    assert_eq!(l["cached_fragmented_bytes"], GIB / 4);
    assert_eq!(l["outside_allocator_bytes"], GIB);
    assert!(l["age_seconds"].as_f64().unwrap() < 5.0, "{l}");
    assert!(l.get("unknown").is_none(), "{l}");
    let m = d.metrics();
    let series = m
        .lines()
        .find(|x| {
            x.starts_with("gpumon_trainer_outside_allocator_bytes{") && x.contains("rank=\"1\"")
        })
        .unwrap_or_else(|| panic!("{m}"));
    assert!(series.ends_with(&format!(" {}", GIB)), "{series}");

    // `gpumon status` shows the part outside the allocator beside allocated and reserved.
    let out = std::process::Command::new(BIN)
        .args(["status", "--listen", &d.addr.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let header = text.lines().find(|l| l.starts_with("JOB")).unwrap();
    assert!(
        header.contains("RESERVED") && header.contains("OUTSIDE"),
        "{text}"
    );
    let row = text.lines().find(|l| l.starts_with("ledger")).unwrap();
    // Right-aligned, ten wide: the cell ends where its heading does.
    let end = header.find("OUTSIDE").unwrap() + "OUTSIDE".len();
    assert_eq!(row[end - 10..end].trim(), "1.0 GiB", "{text}");

    // A trainer on GPU 0, where NVML does not list this process: no figure, and why.
    let _b = trainer(&d, 2, GPU0, GIB, 2 * GIB);
    d.wait_for(Duration::from_secs(5), "the second ledger", || {
        ledger_of(&d, 2)["unknown"].is_string()
    });
    let l = ledger_of(&d, 2);
    assert!(l["outside_allocator_bytes"].is_null(), "{l}");
    assert!(
        l["unknown"]
            .as_str()
            .unwrap()
            .contains("no per-process figure"),
        "{l}"
    );
    assert_eq!(l["allocated_bytes"], GIB);

    // Two sessions of one process on one GPU: NVML's figure is theirs together.
    let _c = trainer(&d, 3, GPU1, GIB, 2 * GIB);
    d.wait_for(Duration::from_secs(5), "the shared ledger", || {
        ledger_of(&d, 1)["unknown"].is_string()
    });
    for rank in [1, 3] {
        let l = ledger_of(&d, rank);
        assert!(l["outside_allocator_bytes"].is_null(), "{l}");
        assert!(
            l["unknown"]
                .as_str()
                .unwrap()
                .contains("share this process"),
            "{l}"
        );
    }
    let m = d.metrics();
    assert!(
        !m.contains("gpumon_trainer_outside_allocator_bytes{"),
        "{m}"
    );
}
