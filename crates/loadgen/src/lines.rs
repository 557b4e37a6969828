//! The lines a trainer sends, shaped like the Python client's (see the protocol fixture
//! client_session.jsonl): every stats key the protocol names plus device_free/total, so the
//! daemon parses as much per line as it would from a real trainer.

use std::time::{SystemTime, UNIX_EPOCH};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

pub fn hello(job: &str, rank: usize) -> String {
    format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":{pid},\"job\":\"{job}\",\"rank\":{rank},\"world_size\":64,\"cuda_device\":{dev},\"gpu_uuid\":\"GPU-8f0c3e1a-5b2d-4c6e-9a7f-{rank:012}\",\"client\":\"gpumon-loadgen/{ver}\",\"torch\":\"2.5.1\",\"allocator\":\"native\",\"expandable_segments\":false}}\n",
        pid = 1000 + rank,
        dev = rank % 8,
        ver = env!("CARGO_PKG_VERSION"),
    )
}

/// Unix time now, in seconds.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Appends one sample line (newline included). Allocated memory wanders a little from step to
/// step, as it does in a real loop.
pub fn sample(out: &mut Vec<u8>, ts: f64, step: u64) {
    let allocated = 20 * GIB + (step % 97) * MIB;
    out.extend_from_slice(b"{\"type\":\"sample\",\"ts\":");
    ts_into(out, ts);
    num(out, b",\"step\":", step);
    out.extend_from_slice(b",\"phase\":\"train\",\"stats\":{");
    num(out, b"\"allocated_bytes.all.current\":", allocated);
    num(out, b",\"allocated_bytes.all.peak\":", 28 * GIB);
    num(out, b",\"reserved_bytes.all.current\":", 30 * GIB);
    num(out, b",\"active_bytes.all.current\":", allocated);
    num(out, b",\"inactive_split_bytes.all.current\":", 256 * MIB);
    num(
        out,
        b",\"requested_bytes.all.current\":",
        allocated - 74 * MIB,
    );
    num(out, b",\"num_alloc_retries\":", 0);
    num(out, b",\"num_ooms\":", 0);
    num(out, b",\"num_sync_all_streams\":", 0);
    num(out, b",\"num_device_alloc\":", 120);
    num(out, b",\"num_device_free\":", 3);
    num(out, b"},\"device_free\":", 47_244_640_256);
    num(out, b",\"device_total\":", 85_520_809_984);
    out.extend_from_slice(b"}\n");
}

fn num(out: &mut Vec<u8>, key: &[u8], v: u64) {
    out.extend_from_slice(key);
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Seconds with millisecond precision, as `time.time()` would print after rounding.
fn ts_into(out: &mut Vec<u8>, ts: f64) {
    let ms = (ts * 1000.0).round() as u64;
    out.extend_from_slice(itoa::Buffer::new().format(ms / 1000).as_bytes());
    let frac = ms % 1000;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_one_json_object_with_the_given_step_and_time() {
        let mut out = Vec::new();
        sample(&mut out, 1_763_700_000.25, 42);
        assert_eq!(out.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["type"], "sample");
        assert_eq!(v["step"], 42);
        assert_eq!(v["ts"], 1_763_700_000.25);
        assert_eq!(
            v["stats"]["allocated_bytes.all.current"],
            20 * GIB + 42 * MIB
        );
        assert_eq!(v["stats"].as_object().unwrap().len(), 11);
    }

    #[test]
    fn hello_is_valid_json() {
        let v: serde_json::Value = serde_json::from_str(&hello("j", 3)).unwrap();
        assert_eq!(v["type"], "hello");
        assert_eq!(v["rank"], 3);
    }
}
