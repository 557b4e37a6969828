//! A trainer capped by `torch.cuda.set_per_process_memory_fraction`, over the real socket into
//! the real daemon: near_limit and the OOM are judged against the cap, not the free device, and
//! the cap is in the API and /metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;

const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// H100 80GB as torch reports it, and a 4.75 GiB cap on it.
const TOTAL: u64 = 85_520_809_984;
const CAP: u64 = 4 * GIB + 768 * MIB;

/// 98% of the cap reserved, the step peak 60 MiB under that, 74 GiB of the device free.
fn capped_sample(step: u64) -> String {
    let reserved = CAP / 100 * 98;
    format!(
        "{{\"type\":\"sample\",\"ts\":{},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{},\"allocated_bytes.all.peak\":{},\"reserved_bytes.all.current\":{reserved},\"num_alloc_retries\":0,\"num_ooms\":0}},\"device_free\":{},\"device_total\":{TOTAL}}}\n",
        1_763_700_000 + step,
        3 * GIB,
        reserved - 60 * MIB,
        74 * GIB + 300 * MIB,
    )
}

fn finding(d: &Daemon, kind: &str) -> Option<serde_json::Value> {
    d.snapshot()["findings"]
        .as_array()?
        .iter()
        .find(|f| f["kind"] == kind && f["state"] == "firing")
        .cloned()
}

#[test]
fn a_capped_trainer_is_judged_against_its_cap() {
    let d = Daemon::with_scenario("two_gpus");
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    let hello = format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":7,\"job\":\"capped\",\"rank\":0,\"gpu_uuid\":\"{GPU0}\",\"alloc_limit\":{CAP}}}\n"
    );
    w.write_all(hello.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    let welcome: serde_json::Value = serde_json::from_str(&line).unwrap();
    let session = welcome["session"].as_str().unwrap().to_string();
    for step in 1..=10 {
        w.write_all(capped_sample(step).as_bytes()).unwrap();
    }

    d.wait_for(Duration::from_secs(10), "near_limit firing", || {
        finding(&d, "near_limit").is_some()
    });
    let f = finding(&d, "near_limit").unwrap();
    let msg = f["message"].as_str().unwrap();
    assert!(
        msg.starts_with("headroom at the step peak is ")
            && msg.ends_with(" of the 4.75 GiB allowed"),
        "{msg}"
    );
    let headroom = f["evidence"]["headroom_bytes"].as_i64().unwrap();
    assert!(headroom > 0 && headroom < 200 * MIB as i64, "{headroom}");
    assert_eq!(f["evidence"]["alloc_limit"].as_u64(), Some(CAP));

    // The cap in the API, for the session and in the snapshot.
    let (code, body) = d.get(&format!("/api/v1/sessions/{session}"));
    assert_eq!(code, 200, "{body}");
    let one: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(one["alloc_limit"].as_u64(), Some(CAP));
    assert_eq!(
        d.snapshot()["sessions"][0]["alloc_limit"].as_u64(),
        Some(CAP)
    );

    // ... and in /metrics, with the trainer series' labels.
    let me = std::process::id();
    let series = format!(
        "gpumon_trainer_alloc_limit_bytes{{gpu=\"0\",uuid=\"{GPU0}\",pid=\"{me}\",job_name=\"capped\",rank=\"0\"}}"
    );
    let m = d.metrics();
    assert_eq!(sample(&m, &series), Some(CAP as f64), "{m}");
    assert!(m.contains("# TYPE gpumon_trainer_alloc_limit_bytes gauge"));
    promtool_check(&m);

    // The OOM torch reports with 74 GiB free on the device names the cap instead.
    let oom = format!(
        "{{\"type\":\"event\",\"ts\":1763700011,\"kind\":\"oom\",\"alloc_bytes\":{},\"device_free\":{},\"alloc_limit\":{CAP},\"detail\":\"CUDA out of memory. Tried to allocate 384.00 MiB.\"}}\n",
        384 * MIB,
        74 * GIB
    );
    w.write_all(oom.as_bytes()).unwrap();
    d.wait_for(Duration::from_secs(10), "oom firing", || {
        finding(&d, "oom").is_some()
    });
    let f = finding(&d, "oom").unwrap();
    assert_eq!(
        f["message"],
        "CUDA out of memory: tried to allocate 384.0 MiB with 4.65 GiB of the 4.75 GiB allowed already reserved at step 10"
    );
}
