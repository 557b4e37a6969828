//! Counters of the HTTP server: connections open now, and those closed, by why.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::admit::Yield;
use super::web_config::ReloadStats;
use crate::util::family::{Family, Kind};
use crate::util::health::Health;

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// The client closed it, or asked for it to be closed after a complete exchange.
    Done,
    /// No complete request head within `http.header_timeout_seconds`.
    HeaderTimeout,
    /// Nothing sent between two requests for `http.keepalive_timeout_seconds`.
    IdleTimeout,
    /// Accepted while `http.connection_limit` connections were open, each serving a request:
    /// closed at once.
    OverCap,
    /// Closed to let a newer connection in while `http.connection_limit` were open (which
    /// kind gave way: `gpumon_http_connections_evicted_total`).
    Evicted,
    /// A request head (URL and headers) past `http.max_request_head_bytes`: answered 431.
    TooLarge,
    /// A request that is not HTTP/1 (answered 400 when hyper could).
    BadRequest,
    /// A read or write failed, or the client went away mid-request.
    IoError,
    /// Still open when the shutdown drain deadline passed.
    Shutdown,
    /// The TLS handshake failed (plain HTTP to a TLS port, no client certificate when one is
    /// required, an untrusted one) or did not finish within the header timeout.
    TlsHandshake,
    /// A response the client did not read for `http.keepalive_timeout_seconds`.
    UnreadOutput,
}

impl Closed {
    pub const ALL: [Closed; 11] = [
        Closed::Done,
        Closed::HeaderTimeout,
        Closed::IdleTimeout,
        Closed::OverCap,
        Closed::Evicted,
        Closed::TooLarge,
        Closed::BadRequest,
        Closed::IoError,
        Closed::Shutdown,
        Closed::TlsHandshake,
        Closed::UnreadOutput,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Closed::Done => "done",
            Closed::HeaderTimeout => "header_timeout",
            Closed::IdleTimeout => "idle_timeout",
            Closed::OverCap => "over_cap",
            Closed::Evicted => "evicted",
            Closed::TooLarge => "too_large",
            Closed::BadRequest => "bad_request",
            Closed::IoError => "io_error",
            Closed::Shutdown => "shutdown",
            Closed::TlsHandshake => "tls_handshake",
            Closed::UnreadOutput => "unread_output",
        }
    }
}

/// Why a request was refused before its handler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// Basic auth required and missing or wrong: 401.
    Unauthorized,
    /// Over the web config's `rate_limit`: 429.
    RateLimited,
    /// Credentials not yet verified waited past 2 s for one of the two bcrypt checks that run
    /// at once (a flood of them): 503 with Retry-After.
    AuthBusy,
    /// The peer address failed basic auth too often lately: 429 with Retry-After, before any
    /// password check.
    AuthThrottled,
    /// A JSON API request over the bound on those served and waiting: 503 with Retry-After.
    Busy,
}

impl Denied {
    pub const ALL: [Denied; 5] = [
        Denied::Unauthorized,
        Denied::RateLimited,
        Denied::AuthBusy,
        Denied::AuthThrottled,
        Denied::Busy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Denied::Unauthorized => "unauthorized",
            Denied::RateLimited => "rate_limited",
            Denied::AuthBusy => "auth_busy",
            Denied::AuthThrottled => "auth_throttled",
            Denied::Busy => "busy",
        }
    }
}

#[derive(Debug, Default)]
pub struct HttpStats {
    open: AtomicU64,
    closed: [AtomicU64; Closed::ALL.len()],
    denied: [AtomicU64; Denied::ALL.len()],
    evicted: [AtomicU64; Yield::ALL.len()],
    /// How the web config's reloads went, once `serve` is given one with a file.
    web_config: std::sync::OnceLock<Arc<ReloadStats>>,
}

impl HttpStats {
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    pub fn closed(&self, why: Closed) -> u64 {
        self.closed[why as usize].load(Ordering::Relaxed)
    }

    pub fn denied(&self, why: Denied) -> u64 {
        self.denied[why as usize].load(Ordering::Relaxed)
    }

    pub fn count_denied(&self, why: Denied) {
        self.denied[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Connections closed to make room, by the kind that gave way.
    pub fn evicted(&self, kind: &str) -> u64 {
        Yield::ALL
            .iter()
            .find(|y| y.as_str() == kind)
            .map_or(0, |y| self.evicted[*y as usize].load(Ordering::Relaxed))
    }

    pub(super) fn count_evicted(&self, kind: Yield) {
        self.evicted[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn count_closed(&self, why: Closed) {
        self.closed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Serves the web config's reload metrics with these (set once; a second call is ignored).
    pub fn attach_web_config(&self, reloads: Arc<ReloadStats>) {
        let _ = self.web_config.set(reloads);
    }

    /// Counts a connection as open until the guard is dropped.
    pub(super) fn opened(self: &Arc<Self>) -> OpenGuard {
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(self.clone())
    }
}

/// The web config's reload families follow the connection ones, once `serve` attached them.
impl Health for HttpStats {
    fn families(&self, out: &mut String) {
        let mut open = Family::gauge("gpumon_http_connections", "HTTP connections open now.", &[]);
        open.add(&[], self.open() as f64);
        open.finish(out);
        let mut closed = Family::new(
            "gpumon_http_connections_closed_total",
            "HTTP connections closed, by reason: done, header_timeout, idle_timeout, over_cap, evicted, too_large, bad_request, io_error, shutdown, tls_handshake, unread_output.",
            Kind::Counter,
            &["reason"],
        );
        for why in Closed::ALL {
            closed.add(&[why.as_str()], self.closed(why) as f64);
        }
        closed.finish(out);
        let mut denied = Family::new(
            "gpumon_http_requests_denied_total",
            "HTTP requests refused before their handler, by reason: unauthorized (basic auth, 401), rate_limited (the web config's rate_limit, 429), auth_busy (credentials not yet verified waited past 2 s for a bcrypt check, 503), auth_throttled (the peer address failed basic auth too often lately, 429), busy (over the bound on JSON API requests served and waiting, 503).",
            Kind::Counter,
            &["reason"],
        );
        for why in Denied::ALL {
            denied.add(&[why.as_str()], self.denied(why) as f64);
        }
        denied.finish(out);
        let mut evicted = Family::new(
            "gpumon_http_connections_evicted_total",
            "HTTP connections closed to let a newer one in at http.connection_limit, by the kind that gave way, in the order kinds give way: unproven (no request completed), unread_output (writes stalled 1 s: the client does not read), auth_failed, idle (keep-alive between requests), over_share (serving a request for a peer address holding more than its share).",
            Kind::Counter,
            &["reason"],
        );
        for y in Yield::ALL {
            evicted.add(
                &[y.as_str()],
                self.evicted[y as usize].load(Ordering::Relaxed) as f64,
            );
        }
        evicted.finish(out);
        if let Some(w) = self.web_config.get() {
            w.families(out);
        }
    }
}

pub(super) struct OpenGuard(Arc<HttpStats>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}
