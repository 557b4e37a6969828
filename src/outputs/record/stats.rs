//! The recorder's counters, read by /metrics (`gpumon_record_*`, health.rs).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Why recording of a session stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The directory holds `max_total_bytes` and nothing finished is left to delete.
    OverCap,
    /// The disk (or quota) is full.
    DiskFull,
    /// Any other error creating or writing the trace.
    WriteError,
    /// The recorder thread fell too far behind (the disk is slower than ingest).
    QueueFull,
}

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::OverCap,
        Reason::DiskFull,
        Reason::WriteError,
        Reason::QueueFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::OverCap => "over_cap",
            Reason::DiskFull => "disk_full",
            Reason::WriteError => "write_error",
            Reason::QueueFull => "queue_full",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Made by the daemon, counted into by its recorder (when one runs) and read by /metrics.
pub struct RecordStats {
    /// A recorder is running (`--record-dir` set and usable).
    pub enabled: AtomicBool,
    /// Bytes of gpumon's trace files in the directory, including files still being written.
    pub bytes: AtomicU64,
    /// gpumon's trace files in the directory.
    pub files: AtomicU64,
    pub sessions: AtomicU64,
    pub write_errors: AtomicU64,
    /// Accepted lines that did not reach their trace (the session's recording stopped).
    pub dropped_lines: AtomicU64,
    /// Finished traces deleted to stay under `max_total_bytes`.
    pub deleted_files: AtomicU64,
    /// Time the recorder thread spent on messages (writes, new parts, pruning), in nanoseconds.
    pub busy_ns: AtomicU64,
    /// Chunks handed to the recorder thread and not yet written, in bytes.
    pub queued_bytes: AtomicU64,
    stopped: [AtomicU64; 4],
}

impl RecordStats {
    pub const fn new() -> Self {
        Self {
            enabled: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
            files: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            dropped_lines: AtomicU64::new(0),
            deleted_files: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            queued_bytes: AtomicU64::new(0),
            stopped: [
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
            ],
        }
    }

    pub fn stop(&self, r: Reason) {
        self.stopped[r.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn stopped(&self, r: Reason) -> u64 {
        self.stopped[r.index()].load(Ordering::Relaxed)
    }
}

impl Default for RecordStats {
    fn default() -> Self {
        Self::new()
    }
}
