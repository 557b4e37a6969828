//! The lines a trainer sends, shaped like the Python client's (see the protocol fixture
//! client_session.jsonl): every stats key the protocol names plus device_free/total, so the
//! daemon parses as much per line as it would from a real trainer. What the figures are is
//! stats.rs's business.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::stats::Sample;

/// Who one session of the load says it is, beyond its job name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub rank: usize,
    pub world_size: usize,
    /// The run the session belongs to (the hello's `run_id`): ranks of one job share it.
    pub run_id: Option<String>,
}

impl Identity {
    /// Session `index` of the load. With `ranks_per_job` 0 (the default) it is what the load
    /// generator always said: rank `index` of a world of 64, no run_id. With `ranks_per_job` n,
    /// the sessions make jobs of n ranks, as torchrun's would: rank `index % n` of a world of
    /// n, in the run `{run_id}-{index / n}`.
    pub fn of(index: usize, ranks_per_job: usize, run_id: &str) -> Self {
        match ranks_per_job {
            0 => Self {
                rank: index,
                world_size: 64,
                run_id: None,
            },
            n => Self {
                rank: index % n,
                world_size: n,
                run_id: Some(format!("{run_id}-{}", index / n)),
            },
        }
    }
}

/// The hello of session `index` (its pid, device and GPU come from the index, whatever its rank).
pub fn hello(job: &str, index: usize, id: &Identity) -> String {
    let run_id = id
        .run_id
        .as_deref()
        .map(|r| format!(",\"run_id\":{}", serde_json::Value::from(r)))
        .unwrap_or_default();
    format!(
        "{{\"type\":\"hello\",\"v\":1,\"pid\":{pid},\"job\":\"{job}\",\"rank\":{rank},\"world_size\":{world}{run_id},\"cuda_device\":{dev},\"gpu_uuid\":\"GPU-8f0c3e1a-5b2d-4c6e-9a7f-{index:012}\",\"client\":\"gpumon-loadgen/{ver}\",\"torch\":\"2.5.1\",\"allocator\":\"native\",\"expandable_segments\":false}}\n",
        pid = 1000 + index,
        rank = id.rank,
        world = id.world_size,
        dev = index % 8,
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

/// Appends one sample line (newline included).
pub fn sample(out: &mut Vec<u8>, ts: f64, s: &Sample) {
    let t = &s.stats;
    out.extend_from_slice(b"{\"type\":\"sample\",\"ts\":");
    ts_into(out, ts);
    num(out, b",\"step\":", s.step);
    out.extend_from_slice(if s.train {
        b",\"phase\":\"train\",\"stats\":{"
    } else {
        b",\"phase\":\"eval\",\"stats\":{"
    });
    num(out, b"\"allocated_bytes.all.current\":", t.allocated);
    num(out, b",\"allocated_bytes.all.peak\":", t.allocated_peak);
    num(out, b",\"reserved_bytes.all.current\":", t.reserved);
    num(out, b",\"active_bytes.all.current\":", t.active);
    num(
        out,
        b",\"inactive_split_bytes.all.current\":",
        t.inactive_split,
    );
    num(out, b",\"requested_bytes.all.current\":", t.requested);
    num(out, b",\"num_alloc_retries\":", t.alloc_retries);
    num(out, b",\"num_ooms\":", t.ooms);
    num(out, b",\"num_sync_all_streams\":", t.sync_all_streams);
    num(out, b",\"num_device_alloc\":", t.device_alloc);
    num(out, b",\"num_device_free\":", t.device_frees);
    num(out, b"},\"device_free\":", t.device_free);
    num(out, b",\"device_total\":", t.device_total);
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

    use crate::stats::{Mode, Source};

    /// The default (`--stats simple`) line, byte for byte as before `--stats` existed.
    #[test]
    fn a_simple_sample_is_the_line_it_always_was() {
        let mut out = Vec::new();
        sample(
            &mut out,
            1_763_700_000.25,
            &Source::new(Mode::Simple, 1, 0).next(41),
        );
        let want = concat!(
            r#"{"type":"sample","ts":1763700000.250,"step":42,"phase":"train","stats":{"#,
            r#""allocated_bytes.all.current":21518876672,"allocated_bytes.all.peak":30064771072,"#,
            r#""reserved_bytes.all.current":32212254720,"active_bytes.all.current":21518876672,"#,
            r#""inactive_split_bytes.all.current":268435456,"#,
            r#""requested_bytes.all.current":21441282048,"num_alloc_retries":0,"num_ooms":0,"#,
            r#""num_sync_all_streams":0,"num_device_alloc":120,"num_device_free":3},"#,
            r#""device_free":47244640256,"device_total":85520809984}"#,
            "\n"
        );
        assert_eq!(String::from_utf8_lossy(&out), want);
    }

    /// A realistic sample carries every key the Python client sends (KNOWN_STATS_KEYS) and
    /// device_free/total, as JSON, eval samples included.
    #[test]
    fn a_realistic_sample_is_one_json_object_with_every_client_key() {
        let mut src = Source::new(Mode::Realistic, 1, 0);
        let (mut step, mut phases) = (0, std::collections::HashSet::new());
        for _ in 0..2000 {
            let s = src.next(step);
            step = s.step;
            let mut out = Vec::new();
            sample(&mut out, 1_763_700_000.0, &s);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["step"], s.step);
            assert_eq!(v["stats"]["allocated_bytes.all.current"], s.stats.allocated);
            assert_eq!(v["stats"].as_object().unwrap().len(), 11);
            assert_eq!(v["device_total"], 85_520_809_984u64);
            assert!(v["device_free"].as_u64().is_some());
            phases.insert(v["phase"].as_str().unwrap().to_string());
        }
        assert_eq!(phases.len(), 2, "{phases:?}");
    }

    #[test]
    fn hello_is_valid_json() {
        let v: serde_json::Value =
            serde_json::from_str(&hello("j", 3, &Identity::of(3, 0, "r"))).unwrap();
        assert_eq!(v["type"], "hello");
        assert_eq!(v["rank"], 3);
    }

    /// Without --ranks-per-job the hello is the one the load generator always sent.
    #[test]
    fn the_default_hello_is_the_one_it_always_was() {
        let h = hello("gpumon-loadgen", 5, &Identity::of(5, 0, "ignored"));
        let want = format!(
            concat!(
                r#"{{"type":"hello","v":1,"pid":1005,"job":"gpumon-loadgen","rank":5,"world_size":64,"#,
                r#""cuda_device":5,"gpu_uuid":"GPU-8f0c3e1a-5b2d-4c6e-9a7f-000000000005","#,
                r#""client":"gpumon-loadgen/{}","torch":"2.5.1","allocator":"native","expandable_segments":false}}"#,
                "\n"
            ),
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(h, want);
    }

    /// --ranks-per-job 8 makes 64 sessions into 8 jobs of ranks 0-7, one run_id each, while
    /// every session keeps its own pid and GPU.
    #[test]
    fn ranks_per_job_makes_jobs_of_that_many_ranks() {
        let hellos: Vec<serde_json::Value> = (0..64)
            .map(|i| serde_json::from_str(&hello("j", i, &Identity::of(i, 8, "run"))).unwrap())
            .collect();
        let mut jobs = std::collections::BTreeMap::<String, Vec<u64>>::new();
        for h in &hellos {
            assert_eq!(h["world_size"], 8);
            jobs.entry(h["run_id"].as_str().unwrap().to_string())
                .or_default()
                .push(h["rank"].as_u64().unwrap());
        }
        assert_eq!(jobs.len(), 8);
        assert!(
            jobs.values().all(|r| *r == (0..8).collect::<Vec<u64>>()),
            "{jobs:?}"
        );
        assert_eq!(hellos[9]["run_id"], "run-1");
        assert_eq!(hellos[9]["pid"], 1009);
        let pids: std::collections::HashSet<_> = hellos.iter().map(|h| h["pid"].clone()).collect();
        assert_eq!(pids.len(), 64);
    }
}
