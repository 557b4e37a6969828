//! One rank of the demo's job, a `gpumon demo-trainer --rank R` child: it pushes samples as an
//! instrumented DDP rank would until its end, then goes down without bye. Rank 2 first says
//! why (its `oom` event, and the client's last line quoting the OutOfMemoryError); the others
//! are torn down by torchrun and say nothing.

use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::{at, end, exception, oom_event, FAILING_RANK, GPU, JOB, WORLD_SIZE};
use crate::frontends::demo::job::device_free;
use crate::frontends::demo::oom::died;
use crate::frontends::demo::profile::{sample_line, STEPS_PER_SECOND};
use crate::frontends::demo::trainer::{connect, stop_if_asked, stop_on_signals};

pub fn run(rank: u64, run_id: &str, socket: &Path, gpu_uuid: &str, t0: f64) -> anyhow::Result<()> {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM));
    stop_on_signals();
    loop {
        let mut s = connect(socket);
        let hello = json!({
            "type": "hello", "v": 1, "pid": std::process::id(), "job": JOB, "rank": rank,
            "world_size": WORLD_SIZE, "cuda_device": 0, "gpu_uuid": gpu_uuid,
            "client": concat!("gpumon-demo/", env!("CARGO_PKG_VERSION")), "torch": "2.5.1",
            "run_id": run_id, "restart": 0,
        });
        if writeln!(s, "{hello}").is_ok() && pump(&mut s, rank, t0) {
            if rank == FAILING_RANK {
                // Stamped when it happened: the failing step never finished.
                let ts = t0 + super::FAIL_AT;
                let _ = writeln!(s, "{}", oom_event(ts));
                let _ = writeln!(s, "{}", died(&exception(), ts));
            }
            let _ = s.flush();
            let _ = s.shutdown(Shutdown::Both);
            std::process::exit(1);
        }
        // The socket broke before the end: a new session, as a reconnecting client's.
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Sends a sample each step until the rank's end (true) or the socket breaks (false).
fn pump(s: &mut UnixStream, rank: u64, t0: f64) -> bool {
    let mut last_step = None;
    loop {
        stop_if_asked(Some(s));
        let t = crate::core::model::now() - t0;
        if t >= end(rank) {
            return true;
        }
        let (step, stats) = at(rank, t);
        if last_step != Some(step) {
            last_step = Some(step);
            let now = crate::core::model::now();
            let sample = sample_line(now, step, &stats, device_free(GPU, t), None);
            if writeln!(s, "{sample}").is_err() {
                return false;
            }
        }
        std::thread::sleep(Duration::from_secs_f64(1.0 / STEPS_PER_SECOND / 2.0));
    }
}
