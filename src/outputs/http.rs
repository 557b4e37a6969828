//! The HTTP side: /metrics, /api/v1/snapshot, /healthz, /readyz. The router is here; the
//! server that runs it, with its limits, is in `serve`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::Semaphore;

use super::prometheus::Exporter;
use crate::core::aggregator::Handle;
use crate::core::query::{Answer, Query as Read};
use crate::core::snapshot::Snapshot;
use crate::sources::ingest::stats::IngestStats;

mod admit;
pub mod gzip;
pub mod serve;
mod stats;
mod throttle;
pub mod web_config;

pub use serve::{serve, HttpLimits, MIN_HEAD_BYTES};
pub use stats::{Closed, Denied, HttpStats};

#[derive(Clone)]
pub struct AppState {
    /// The store's owner: /metrics and /readyz read its latest view, the JSON API asks it.
    pub aggregator: Handle,
    pub exporter: Arc<Exporter>,
    pub hostname: Arc<str>,
    pub ingest: Arc<IngestStats>,
    /// TLS, basic auth, headers and rate limit (`http.web_config_file`).
    pub web: Arc<web_config::WebConfigWatch>,
    pub http: Arc<HttpStats>,
}

/// Snapshots built at once. Each is copied out of the store by the aggregator (between trainer
/// batches) and serialised on the blocking pool, never on the runtime's workers, so /metrics
/// and /healthz answer whatever snapshots are in flight; the cap keeps many requests from
/// taking every core and a copy of the store each.
const SNAPSHOT_BUILDS: usize = 2;
/// How long a snapshot request waits for a build slot before it is told to come back.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(5);

/// JSON API requests (`/api/v1/*`) served at once. /metrics and the health checks are outside
/// this bound: scrapes first.
pub const API_IN_FLIGHT: usize = 4;
/// API requests that may wait for one of those, at most `API_WAIT` each; one more is answered
/// 503 at once. Waiting costs no CPU, so clients that loop without honouring Retry-After are
/// slowed to the pace of the builds instead of spinning on refusals.
pub const API_QUEUE: usize = 32;
const API_WAIT: Duration = Duration::from_secs(1);

pub fn router(state: AppState) -> Router {
    let builds = Arc::new(Semaphore::new(SNAPSHOT_BUILDS));
    let api_slots = Arc::new(ApiSlots {
        admitted: Semaphore::new(API_IN_FLIGHT + API_QUEUE),
        serving: Semaphore::new(API_IN_FLIGHT),
    });
    let api = Router::new()
        .route(
            "/api/v1/snapshot",
            get(move |st, q| snapshot(st, q, builds.clone())),
        )
        .route("/api/v1/sessions/{id}", get(session))
        .route_layer(middleware::from_fn_with_state(
            (state.http.clone(), api_slots),
            api_bound,
        ));
    let guarded = Guarded {
        app: state.clone(),
        throttle: Arc::new(throttle::AuthThrottle::default()),
    };
    Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(api)
        .layer(middleware::from_fn_with_state(guarded, guard))
        .with_state(state)
}

/// The JSON API's bound: requests admitted (serving or waiting), and those serving.
struct ApiSlots {
    admitted: Semaphore,
    serving: Semaphore,
}

/// Serves a JSON API request within `API_IN_FLIGHT`, after waiting at most `API_WAIT` among
/// at most `API_QUEUE`; else 503, naming the bound.
async fn api_bound(
    State((stats, slots)): State<(Arc<HttpStats>, Arc<ApiSlots>)>,
    req: Request,
    next: Next,
) -> Response {
    let busy = || {
        stats.count_denied(Denied::Busy);
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            format!("busy: the JSON API serves at most {API_IN_FLIGHT} requests at once, with {API_QUEUE} more waiting up to {} s; retry after 1 s (/metrics, /healthz and /readyz are never refused by this bound)\n", API_WAIT.as_secs()),
        )
            .into_response()
    };
    let Ok(_admitted) = slots.admitted.try_acquire() else {
        return busy();
    };
    let Ok(Ok(_serving)) = tokio::time::timeout(API_WAIT, slots.serving.acquire()).await else {
        return busy();
    };
    next.run(req).await
}

/// The guard's state: the app, and the per-peer count of basic-auth failures.
#[derive(Clone)]
struct Guarded {
    app: AppState,
    throttle: Arc<throttle::AuthThrottle>,
}

/// bcrypt checks run at once: one per core of the machine this is sized for (cost 10 takes
/// about 50 ms), so unverified credentials can never take the CPU the poller and ingest need.
static BCRYPT_CHECKS: Semaphore = Semaphore::const_new(2);
/// How long a request with unverified credentials waits for a check before it gets 503.
const BCRYPT_WAIT: Duration = Duration::from_secs(2);

/// What the web config asks of every request, health checks included (as in exporter-toolkit):
/// the rate limit, then basic auth, then its response headers.
async fn guard(State(g): State<Guarded>, req: Request, next: Next) -> Response {
    let s = &g.app;
    let web = s.web.current();
    if web.rate_limit.as_ref().is_some_and(|r| !r.admit()) {
        s.http.count_denied(Denied::RateLimited);
        return (StatusCode::TOO_MANY_REQUESTS, "rate limited\n").into_response();
    }
    if web.auth.enabled() {
        let peer = req.extensions().get::<serve::Peer>().cloned();
        let given = req.headers().get(header::AUTHORIZATION);
        let quick = web.auth.quick(given.map(|v| v.as_bytes()));
        // Credentials verified before pass whatever the peer's failures; other credentials
        // from a peer that failed too often lately are refused before they can cost a bcrypt
        // check. No credentials at all guess nothing and cost nothing: a plain 401.
        let tried = given.is_some();
        if tried && quick != Some(web_config::Verdict::Allowed) {
            if let Some(wait) = peer.as_ref().and_then(|p| g.throttle.take(p.ip)) {
                if let Some(p) = &peer {
                    p.auth_failed(true);
                }
                s.http.count_denied(Denied::AuthThrottled);
                let secs = wait.as_secs_f64().ceil().max(1.0);
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, format!("{secs}"))],
                    format!("too many failed logins from this address; retry after {secs} s\n"),
                )
                    .into_response();
            }
        }
        let verdict = match quick {
            Some(v) => v,
            None => {
                // Credentials seen once are remembered (`quick`), so a scraper waits here only
                // for its first request; a flood of wrong passwords queues behind this cap
                // instead of taking every core.
                let Ok(Ok(_permit)) =
                    tokio::time::timeout(BCRYPT_WAIT, BCRYPT_CHECKS.acquire()).await
                else {
                    s.http.count_denied(Denied::AuthBusy);
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(header::RETRY_AFTER, "1")],
                        "too many credentials being checked; retry\n",
                    )
                        .into_response();
                };
                let (check, given) = (web.clone(), given.map(|v| v.as_bytes().to_vec()));
                // bcrypt takes tens of milliseconds by design: never on the runtime's workers.
                tokio::task::spawn_blocking(move || check.auth.check(given.as_deref()))
                    .await
                    .unwrap_or(web_config::Verdict::Denied)
            }
        };
        if let Some(p) = &peer {
            p.auth_failed(verdict != web_config::Verdict::Allowed);
            if tried && quick.is_none() && verdict == web_config::Verdict::Allowed {
                g.throttle.passed(p.ip);
            }
        }
        if verdict != web_config::Verdict::Allowed {
            s.http.count_denied(Denied::Unauthorized);
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"gpumon\"")],
                "Unauthorized\n",
            )
                .into_response();
        }
    }
    let mut resp = next.run(req).await;
    for (name, value) in &web.headers {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    resp
}

async fn index() -> &'static str {
    "gpumon: see /metrics, /api/v1/snapshot, /api/v1/sessions/{id}, /healthz, /readyz\n"
}

const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The text, gzip-compressed when the scraper accepts it (Prometheus always does).
async fn metrics(State(s): State<AppState>, headers: HeaderMap) -> Response {
    // What an API read showed before this scrape is in it (the view is published first).
    s.aggregator.sync().await;
    let vary = (header::VARY, "Accept-Encoding");
    if gzip::accepts_gzip(headers.get_all(header::ACCEPT_ENCODING)) {
        match s.exporter.render_gzip() {
            Ok(body) => {
                return (
                    [
                        (header::CONTENT_TYPE, METRICS_TYPE),
                        (header::CONTENT_ENCODING, "gzip"),
                        vary,
                    ],
                    body,
                )
                    .into_response()
            }
            // Compressing into memory fails only on a bug; the plain text still serves.
            Err(e) => tracing::error!(error = %e, "gzip of /metrics failed; serving it plain"),
        }
    }
    (
        [(header::CONTENT_TYPE, METRICS_TYPE), vary],
        s.exporter.render(),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
struct SnapshotQuery {
    /// Seconds of GPU memory history to include.
    #[serde(default)]
    history: Option<f64>,
    /// The `cursor` of an earlier answer (empty for none yet): the answer carries a cursor and,
    /// when this daemon wrote the one given, only the history after it.
    #[serde(default)]
    since: Option<String>,
}

async fn snapshot(
    State(s): State<AppState>,
    query: Result<Query<SnapshotQuery>, axum::extract::rejection::QueryRejection>,
    builds: Arc<Semaphore>,
) -> Response {
    let (history, since) = match query {
        Ok(Query(q)) => (q.history.unwrap_or(0.0), q.since),
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("{e}; use ?history=SECONDS, e.g. ?history=300, and since=CURSOR\n"),
            )
                .into_response()
        }
    };
    if !history.is_finite() || history < 0.0 {
        return (
            StatusCode::BAD_REQUEST,
            format!("history={history} is not a number of seconds >= 0\n"),
        )
            .into_response();
    }
    let busy = || {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "too many snapshots in flight; retry in a second\n",
        )
            .into_response()
    };
    let permit = match tokio::time::timeout(SNAPSHOT_WAIT, builds.acquire_owned()).await {
        Ok(Ok(p)) => p,
        _ => return busy(),
    };
    let asked = Read::Snapshot {
        hostname: s.hostname.to_string(),
        history,
        since,
    };
    let Some(Answer::Snapshot(snap)) = s.aggregator.query(asked).await else {
        return unavailable();
    };
    let ingest = s.ingest.view();
    let built = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let size = &ANSWER_SIZE[usize::from(snap.delta)];
        let last = size.load(Ordering::Relaxed);
        let mut body = Vec::with_capacity(last + last / 16);
        let done = serde_json::to_writer(
            &mut body,
            &Snapshot {
                ingest: Some(ingest),
                ..*snap
            },
        );
        size.store(body.len(), Ordering::Relaxed);
        done.map(|()| body)
    })
    .await;
    match built {
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        _ => unavailable(),
    }
}

/// The length of the last whole snapshot answer and of the last delta: the next one's buffer is
/// made about that big at once. Grown from empty, an 84 KB delta (64 trainers) was copied ten
/// times over, and its last doubling, past the fixed mmap threshold (malloc.rs), took fresh
/// pages at every refresh: a quarter of what the answer cost the daemon.
static ANSWER_SIZE: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// The aggregator is gone: the daemon is stopping.
fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the daemon is shutting down\n",
    )
        .into_response()
}

/// One trainer session, shaped as in the snapshot: a cheap poll for a dashboard (or a probe)
/// that follows one trainer, without serialising every session.
async fn session(State(s): State<AppState>, Path(id): Path<String>) -> Response {
    let Some(Answer::Session(view)) = s.aggregator.query(Read::Session(id.clone())).await else {
        return unavailable();
    };
    match view {
        Some(v) => Json(v).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no session {id:?}: it never existed or ended too long ago; /api/v1/snapshot lists them\n"),
        )
            .into_response(),
    }
}

/// Ready once the first collection attempt has finished, whatever its outcome: from then on
/// /metrics says something true (including `gpumon_nvml_up 0`).
async fn readyz(State(s): State<AppState>) -> Response {
    if s.aggregator.view().ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first NVML poll\n",
        )
            .into_response()
    }
}
