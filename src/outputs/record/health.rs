//! gpumon_record_* families: the trace recorder (`--record-dir`), so a full, read-only or
//! unusable record directory is visible to alerting, not only in the log.

use std::sync::atomic::Ordering;

use super::stats::{Reason, RecordStats};
use crate::util::family::{Family, Kind};
use crate::util::health::Health;

impl Health for RecordStats {
    fn families(&self, out: &mut String) {
        let s = self;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
        let counter = |name: &'static str, help: &'static str, v: f64, out: &mut String| {
            let mut f = Family::new(name, help, Kind::Counter, &[]);
            f.add(&[], v);
            f.finish(out);
        };
        let mut f = Family::gauge(
            "gpumon_record_enabled",
            "1 while traces are recorded (--record-dir set and usable); 0 when not configured or the directory could not be used.",
            &[],
        );
        f.add(
            &[],
            if s.enabled.load(Ordering::Relaxed) {
                1.0
            } else {
                0.0
            },
        );
        f.finish(out);
        let mut f = Family::gauge(
            "gpumon_record_bytes",
            "Bytes of gpumon's trace files in the record directory, files being written included.",
            &[],
        );
        f.add(&[], load(&s.bytes));
        f.finish(out);
        let mut f = Family::gauge(
            "gpumon_record_files",
            "gpumon's trace files in the record directory.",
            &[],
        );
        f.add(&[], load(&s.files));
        f.finish(out);
        counter(
            "gpumon_record_sessions_total",
            "Sessions whose recording started.",
            load(&s.sessions),
            out,
        );
        counter(
            "gpumon_record_write_errors_total",
            "Trace files that could not be created or written.",
            load(&s.write_errors),
            out,
        );
        counter(
            "gpumon_record_dropped_lines_total",
            "Accepted lines not written to their trace because the session's recording stopped.",
            load(&s.dropped_lines),
            out,
        );
        counter(
            "gpumon_record_deleted_files_total",
            "gpumon's own finished traces deleted to stay under record.max_total_bytes and record.max_files.",
            load(&s.deleted_files),
            out,
        );
        counter(
            "gpumon_record_busy_seconds_total",
            "Time the recorder thread spent writing traces, starting parts and pruning the directory; its rate is the share of a core it uses.",
            load(&s.busy_ns) / 1e9,
            out,
        );
        let mut f = Family::gauge(
            "gpumon_record_queued_bytes",
            "Trace bytes handed to the recorder thread and not yet written (a session stops recording, counted as queue_full, past 32 MiB).",
            &[],
        );
        f.add(&[], load(&s.queued_bytes));
        f.finish(out);
        let mut f = Family::new(
            "gpumon_record_sessions_stopped_total",
            "Sessions whose recording stopped before they ended, by reason (over_cap, disk_full, write_error, queue_full).",
            Kind::Counter,
            &["reason"],
        );
        for r in Reason::ALL {
            f.add(&[r.as_str()], s.stopped(r) as f64);
        }
        f.finish(out);
    }
}
