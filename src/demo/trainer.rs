//! `gpumon demo-trainer`: one simulated trainer, a real child process that pushes samples over the
//! real ingest socket, as an instrumented PyTorch loop would. It dies with its parent.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::profile::{device_free, Profile, STEPS_PER_SECOND, TOTAL};

pub fn run(profile: Profile, socket: &Path, gpu_uuid: &str, t0: f64) -> anyhow::Result<()> {
    // The demo's children must not outlive it, even when it is killed.
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    let mut generation = 0u64;
    loop {
        let mut s = connect(socket);
        let hello = json!({
            "type": "hello", "v": 1, "pid": std::process::id(), "job": profile.job(), "rank": 0,
            "world_size": 1, "cuda_device": 0, "gpu_uuid": gpu_uuid,
            "client": concat!("gpumon-demo/", env!("CARGO_PKG_VERSION")), "torch": "2.5.1",
        });
        if writeln!(s, "{hello}").is_err() {
            continue;
        }
        let restarted = pump(&mut s, profile, t0, generation);
        if !restarted {
            std::thread::sleep(Duration::from_secs(1));
        }
        generation += 1;
    }
}

fn connect(socket: &Path) -> UnixStream {
    loop {
        if let Ok(s) = UnixStream::connect(socket) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Sends samples until the socket breaks (false) or the leak hits OOM and "restarts" (true).
fn pump(s: &mut UnixStream, profile: Profile, t0: f64, generation: u64) -> bool {
    let gpu = profile.gpu();
    let mut last_step = None;
    loop {
        let t = crate::model::now() - t0;
        if let Some(p) = profile.period() {
            // The leak ran the GPU out of memory: an OOM, and the process goes down without bye
            // (the daemon records the crash); it comes back as a new session.
            if (t / p) as u64 > generation {
                let free = device_free(gpu, t - 0.01);
                let oom = json!({"type": "event", "ts": crate::model::now(), "kind": "oom",
                    "alloc_bytes": 2u64 << 30, "device_free": free,
                    "detail": "CUDA out of memory. Tried to allocate 2.00 GiB"});
                let _ = writeln!(s, "{oom}");
                return true;
            }
        }
        let (step, stats) = profile.at(t);
        if last_step != Some(step) {
            last_step = Some(step);
            let sample = json!({
                "type": "sample", "ts": crate::model::now(), "step": step, "phase": "train",
                "stats": {
                    "allocated_bytes.all.current": stats.allocated,
                    "allocated_bytes.all.peak": stats.allocated_peak,
                    "reserved_bytes.all.current": stats.reserved,
                    "active_bytes.all.current": stats.active,
                    "inactive_split_bytes.all.current": stats.inactive_split,
                    "requested_bytes.all.current": stats.requested,
                    "num_alloc_retries": stats.alloc_retries,
                    "num_ooms": stats.ooms,
                },
                "device_free": device_free(gpu, t), "device_total": TOTAL,
            });
            if writeln!(s, "{sample}").is_err() {
                return false;
            }
        }
        std::thread::sleep(Duration::from_secs_f64(1.0 / STEPS_PER_SECOND / 2.0));
    }
}
