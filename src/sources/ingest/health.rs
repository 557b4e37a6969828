//! gpumon_ingest_* families: the socket's connections, lines and refusals, read per scrape.

use std::sync::atomic::Ordering;

use super::stats::IngestStats;
use crate::util::family::{Family, Kind};
use crate::util::health::Health;

impl Health for IngestStats {
    fn families(&self, out: &mut String) {
        Family::single(
            "gpumon_ingest_connections",
            "Open trainer connections.",
            Kind::Gauge,
            self.connections.load(Ordering::Relaxed) as f64,
            out,
        );
        Family::single(
            "gpumon_ingest_lines_total",
            "Ingest lines accepted.",
            Kind::Counter,
            self.lines.load(Ordering::Relaxed) as f64,
            out,
        );
        let mut f = Family::new(
            "gpumon_ingest_rejected_total",
            "Ingest lines rejected, by protocol error code.",
            Kind::Counter,
            &["code"],
        );
        for (code, n) in self.rejected_by_code() {
            f.add(&[code], n as f64);
        }
        f.finish(out);
        let mut f = Family::new(
            "gpumon_ingest_dropped_total",
            "Lines trainers dropped because the daemon could not take them (unreachable, or reading too slowly), as the clients report them.",
            Kind::Counter,
            &[],
        );
        // The daemon applies every line it reads; what is lost is lost before it, in the client's
        // bounded buffer, and the client says how much on its next connection.
        f.add(&[], self.dropped.load(Ordering::Relaxed) as f64);
        f.finish(out);
        Family::single(
            "gpumon_ingest_replies_dropped_total",
            "Replies not sent because the client was not reading its socket.",
            Kind::Counter,
            self.replies_dropped.load(Ordering::Relaxed) as f64,
            out,
        );
        Family::single(
            "gpumon_ingest_duplicates_total",
            "Numbered lines dropped because their client had sent them already (a resend after a reconnect; capability ack).",
            Kind::Counter,
            self.duplicates.load(Ordering::Relaxed) as f64,
            out,
        );
        Family::single(
            "gpumon_ingest_requests_total",
            "Requests sent to trainers (attribute: record a window of allocation history).",
            Kind::Counter,
            self.requests.load(Ordering::Relaxed) as f64,
            out,
        );
        Family::single(
            "gpumon_ingest_line_buffer_bytes",
            "Bytes trainer connections buffer past their first 4 KiB (bursts, lines longer than that), all together; kept within ingest.max_line_buffer_bytes.",
            Kind::Gauge,
            self.line_buffer_bytes.load(Ordering::Relaxed) as f64,
            out,
        );
        let mut f = Family::new(
            "gpumon_ingest_closed_total",
            "Connections the daemon closed or refused, by reason: no hello in time, idle past the timeout, over the per-uid cap, evicted before hello to make room, sitting on an unfinished long line while others needed the line buffer.",
            Kind::Counter,
            &["reason"],
        );
        for (why, n) in self.closed_by_reason() {
            f.add(&[why], n as f64);
        }
        f.finish(out);
    }
}
