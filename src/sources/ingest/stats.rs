//! The ingest counters (gpumon_ingest_* series and the TUI header), apart from the accept loop
//! so that the parts that count into them (batches, the line budget) need not import it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::protocol::Code;
use crate::core::snapshot::IngestView;

/// Why the daemon closed a connection (gpumon_ingest_closed_total{reason}).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// No hello within `hello_timeout`.
    HelloTimeout,
    /// Nothing for `idle_timeout` after the hello.
    IdleTimeout,
    /// Refused at connect: its uid holds `max_per_uid` connections, all past hello.
    PerUidLimit,
    /// Closed before its hello to make room for a new connection.
    Evicted,
    /// Sat on an unfinished long line while others needed the line buffer budget.
    LineStalled,
}

impl Close {
    pub const ALL: [Close; 5] = [
        Close::HelloTimeout,
        Close::IdleTimeout,
        Close::PerUidLimit,
        Close::Evicted,
        Close::LineStalled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Close::HelloTimeout => "hello_timeout",
            Close::IdleTimeout => "idle_timeout",
            Close::PerUidLimit => "per_uid_limit",
            Close::Evicted => "evicted",
            Close::LineStalled => "line_stalled",
        }
    }
}

/// Counters for the gpumon_ingest_* series.
#[derive(Debug, Default)]
pub struct IngestStats {
    pub connections: AtomicU64,
    pub lines: AtomicU64,
    pub rejected: [AtomicU64; Code::ALL.len()],
    /// Replies and requests not sent because the client was not reading.
    pub replies_dropped: AtomicU64,
    /// Requests (`attribute`) sent to trainers, dropped ones included.
    pub requests: AtomicU64,
    /// Numbered lines dropped because their client's instance had sent them already.
    pub duplicates: AtomicU64,
    /// Lines trainers dropped because the daemon could not take them, as they report it.
    pub dropped: AtomicU64,
    /// Connections the daemon closed, by `Close` (in `Close::ALL` order).
    pub closed: [AtomicU64; Close::ALL.len()],
    /// Bytes granted from the line buffer budget now, all connections together.
    pub line_buffer_bytes: AtomicU64,
}

impl IngestStats {
    pub(super) fn reject(&self, code: Code) {
        self.reject_many(code, 1);
    }

    pub(super) fn reject_many(&self, code: Code, n: u64) {
        if let Some(i) = Code::ALL.iter().position(|c| *c == code) {
            self.rejected[i].fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(super) fn closed(&self, why: Close) {
        if let Some(i) = Close::ALL.iter().position(|c| *c == why) {
            self.closed[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lines and connections refused, by protocol error code (its wire name).
    pub fn rejected_by_code(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Code::ALL
            .iter()
            .zip(&self.rejected)
            .map(|(c, n)| (c.as_str(), n.load(Ordering::Relaxed)))
    }

    /// Connections the daemon closed, by reason.
    pub fn closed_by_reason(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Close::ALL
            .iter()
            .zip(&self.closed)
            .map(|(c, n)| (c.as_str(), n.load(Ordering::Relaxed)))
    }

    /// The counters readers of the JSON API get (the TUI header).
    pub fn view(&self) -> IngestView {
        IngestView {
            connections: self.connections.load(Ordering::Relaxed),
            lines: self.lines.load(Ordering::Relaxed),
            rejected: self.rejected_by_code().map(|(_, n)| n).sum(),
            dropped: self.replies_dropped.load(Ordering::Relaxed),
        }
    }
}
