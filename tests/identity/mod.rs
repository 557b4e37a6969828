//! Trainers of two users on one daemon, for the job identity tests (docs/jobs.md: a job is
//! (job, run_id, uid)). Other uids without other processes: SO_PEERCRED records the connecting
//! thread's effective uid, and credentials are per thread under the raw syscalls, so a thread
//! that switches its euid (keeping fsuid 0, to reach the root-only socket directory) connects
//! as that user; the stream it made stays that user's after the thread is gone.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const GIB: u64 = 1 << 30;
/// The other user's uid: no account needed, the kernel takes any number.
pub const OTHER: u32 = 20001;

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: connecting as other uids needs root");
    }
    root
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Runs `f` on a thread whose effective uid is `uid` (its fsuid stays 0, so paths resolve as
/// root's): what it connects is credited to `uid`.
pub fn as_uid<T: Send + 'static>(uid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let keep = libc::uid_t::MAX; // -1: leave that id as it is
                                     // SAFETY: raw syscalls change only this thread's credentials (libc's wrappers would
                                     // change every thread's); real and saved uid stay 0, so both can be undone.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresuid, keep, uid, keep), 0);
            libc::syscall(libc::SYS_setfsuid, 0);
        }
        let r = f();
        // SAFETY: as above.
        unsafe {
            assert_eq!(libc::syscall(libc::SYS_setresuid, keep, 0, keep), 0);
        }
        r
    })
    .join()
    .unwrap()
}

/// One rank's connection.
pub struct Rank {
    pub s: UnixStream,
    pub rank: u64,
}

/// Connects (as the calling thread's user), says hello with `extra` fields and waits for the
/// welcome.
pub fn connect(socket: &Path, job: &str, run: &str, rank: u64, world: u64, extra: &str) -> Rank {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    writeln!(
        s,
        r#"{{"type":"hello","v":1,"pid":{},"job":"{job}","run_id":"{run}","rank":{rank},"world_size":{world},"gpu_uuid":"GPU-{rank}"{extra}}}"#,
        100 + rank
    )
    .unwrap();
    let mut welcome = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut welcome)
        .unwrap();
    assert!(welcome.contains("welcome"), "{welcome}");
    Rank { s, rank }
}

impl Rank {
    /// `n` steps of samples, the last dated now (the trainer's clock).
    pub fn steps(&mut self, n: u64) {
        let t0 = unix_now() - n as f64;
        for step in 1..=n {
            self.sample(t0 + step as f64, step);
        }
    }

    pub fn sample(&mut self, ts: f64, step: u64) {
        writeln!(
            self.s,
            "{{\"type\":\"sample\",\"ts\":{ts},\"step\":{step},\"stats\":{{\"allocated_bytes.all.current\":{},\"allocated_bytes.all.peak\":{},\"reserved_bytes.all.current\":{}}},\"device_free\":{},\"device_total\":{}}}",
            20 * GIB,
            (30 + self.rank) * GIB,
            40 * GIB,
            40 * GIB,
            80 * GIB,
        )
        .unwrap();
    }

    pub fn oom(&mut self, ts: f64) {
        writeln!(
            self.s,
            r#"{{"type":"event","ts":{ts},"kind":"oom","alloc_bytes":{},"device_free":104857600,"detail":"CUDA out of memory. Tried to allocate 2.00 GiB"}}"#,
            2 * GIB
        )
        .unwrap();
    }
}
