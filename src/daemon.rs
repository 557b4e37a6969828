//! `gpumon daemon`: wires the poller and the ingest socket into the aggregator (the one owner of
//! the store), its view into the HTTP server and its finding transitions into the alert thread,
//! and drains them all on shutdown, in the order data flows. Takes an already-bound listener
//! (the mini-redis shape), so tests bind port 0.

use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::core::store::{HistoryLimits, Store};
use crate::core::tap::Tap;
use crate::outputs::http::web_config::WebConfigWatch;
use crate::outputs::http::{router, AppState};
use crate::outputs::prometheus::Exporter;
use crate::outputs::record::{self, Recorder};
use crate::sources::ingest::server::Limits;
use crate::sources::ingest::stats::IngestStats;
use crate::sources::GpuSource;
use crate::util::health::Health;
use crate::{core::aggregator, outputs::prometheus};

pub async fn run(
    config: Config,
    listener: TcpListener,
    ingest: Option<UnixListener>,
    source: Box<dyn GpuSource>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // Before anything starts: a bad web config is a configuration error (exit 78).
    let web = Arc::new(web_config(&config)?);
    reload_on_sighup(web.clone())?;
    let mut store = Store::new(
        HistoryLimits {
            gpu_points: config.history.gpu_points,
        },
        config.interval.as_secs_f64(),
        config.nvml_lib.clone(),
    );
    store.set_sessions(
        crate::core::store::sessions::Sessions::new(Default::default())
            .with_id_epoch(crate::core::model::now())
            .with_log()
            .with_detect(config.detect())
            .with_attribution(config.attribution())
            .with_arming(config.oom()),
    );
    let hostname = config
        .node_name
        .clone()
        .unwrap_or_else(crate::core::snapshot::hostname);
    let mut alerts = crate::outputs::alerts::spawn(crate::outputs::alerts::AlertSettings {
        webhook_url: config.alerts.webhook_url.clone(),
        alertmanager_url: config.alerts.alertmanager_url.clone(),
        resend_interval: config.alerts.resend_interval,
        hostname: hostname.clone(),
        api_url: format!("http://{}/api/v1/snapshot", listener.local_addr()?),
    })?;
    let (agg, agg_thread) = aggregator::spawn(
        store,
        prometheus::trainer_text,
        alerts.as_mut().and_then(|a| a.transitions.take()),
    )?;
    if let Some(a) = &alerts {
        a.attach(agg.downgrade());
    }

    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let poll_agg = agg.clone();
    let interval = config.interval;
    // Pod names join the processes on the poller's thread; the kubelet is asked on its own.
    let source = Box::new(crate::sources::kubelet::Named::new(
        source,
        &config.kubernetes,
    ));
    let poller = std::thread::Builder::new()
        .name("gpumon-nvml".into())
        .spawn(move || {
            crate::sources::poller::run(source, poll_agg, prometheus::gpu_text, interval, stop_rx)
        })?;

    // Made here, not by the recorder: /metrics reports it with or without one running.
    let record_stats = Arc::new(record::RecordStats::new());
    let recorder = config.record.dir.as_deref().and_then(|dir| {
        match Recorder::on_host(
            dir,
            record::Caps {
                file_bytes: config.record.max_file_bytes,
                total_bytes: config.record.max_total_bytes,
                files: config.record.max_files,
            },
            record_stats.clone(),
            hostname.clone(),
        ) {
            Ok(r) => Some(r),
            Err(e) => {
                // Like a missing NVML: the daemon still serves, and /metrics says so
                // (gpumon_record_enabled 0).
                tracing::error!(dir = %dir.display(), error = %e, "cannot record traces: running without recording; make the directory writable for the daemon's user (record.dir, --record-dir)");
                None
            }
        }
    });
    let ingest_stats = Arc::new(IngestStats::default());
    let ingest_task = ingest.map(|l| {
        let limits = ingest_limits(&config.ingest);
        tokio::spawn(crate::sources::ingest::server::serve(
            l,
            agg.clone(),
            ingest_stats.clone(),
            limits,
            recorder.clone().map(|r| r as Arc<dyn Tap>),
            shutdown.clone(),
        ))
    });
    let http_stats = Arc::new(crate::outputs::http::HttpStats::default());
    // Each part's own counters, in the order /metrics has always listed them.
    let mut health: Vec<Arc<dyn Health + Send + Sync>> = vec![
        ingest_stats.clone(),
        record_stats,
        http_stats.clone(),
        Arc::new(agg.clone()),
    ];
    if let Some(a) = &alerts {
        health.push(a.stats.clone());
    }
    let state = AppState {
        exporter: Arc::new(Exporter::new(agg.subscribe(), health)?),
        ingest: ingest_stats,
        aggregator: agg.clone(),
        hostname: hostname.into(),
        web: web.clone(),
        http: http_stats.clone(),
    };
    let stopper = agg;
    let compress = tokio::spawn(state.exporter.clone().compress_each_collection());
    let trim = tokio::spawn(crate::malloc::give_back_free_pages());
    // What an operator needs to know is on: where, how protected, what is recorded.
    let w = web.current();
    let record = config
        .record
        .dir
        .as_ref()
        .map_or_else(|| "off".to_string(), |d| d.display().to_string());
    tracing::info!(
        listen = %listener.local_addr()?,
        tls = w.tls.is_some(),
        client_certs = w.client_certs,
        basic_auth_users = w.auth.users(),
        record_dir = %record,
        nvml_lib = %config.nvml_lib,
        interval = ?config.interval,
        "gpumon daemon serving"
    );
    let result = crate::outputs::http::serve(
        listener,
        router(state),
        (&config.http).into(),
        http_stats,
        web,
        shutdown.clone(),
    )
    .await;
    // No scrape is left to serve: its Arc<Exporter> (with an aggregator handle) goes now.
    compress.abort();
    trim.abort();
    // The HTTP server stops only on shutdown, so the ingest task is stopping too.
    if let Some(t) = ingest_task {
        t.await?;
    }
    // Every connection is closed: write out what the recorder still holds.
    if let Some(r) = recorder {
        tokio::task::spawn_blocking(move || r.finish()).await?;
    }

    // Then the poller, whose handle is the last one keeping the aggregator running: it ends
    // after applying what is queued (the sessions closed at shutdown), and its end closes the
    // alert thread's channel, which delivers those last transitions and stops.
    drop(stop_tx);
    tokio::task::spawn_blocking(move || poller.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the NVML poller thread panicked"))?;
    stopper.stop().await;
    drop(stopper);
    tokio::task::spawn_blocking(move || agg_thread.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the aggregator thread panicked"))?;
    if let Some(a) = alerts {
        tokio::task::spawn_blocking(move || a.thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the alert thread panicked"))?;
    }
    tracing::info!("gpumon daemon stopped");
    Ok(result?)
}

/// The ingest caps from `[ingest]`. Seconds were range-checked by `Config::validate`; a config
/// built in code without it falls back to the default for a value a Duration cannot hold.
fn ingest_limits(c: &crate::config::IngestConfig) -> Limits {
    let d = Limits::default();
    let secs = |s: f64, default| std::time::Duration::try_from_secs_f64(s).unwrap_or(default);
    Limits {
        max_connections: c.max_connections,
        max_lines_per_second: c.max_lines_per_second,
        hello_timeout: secs(c.hello_timeout_seconds, d.hello_timeout),
        idle_timeout: secs(c.idle_timeout_seconds, d.idle_timeout),
        max_per_uid: c.max_connections_per_uid,
        reserved: c.reserved_connections,
        line_buffer_bytes: c.max_line_buffer_bytes,
    }
}

/// Whether `http.web_config_file` loads: checked before the ingest socket is bound, so a bad
/// file is the first and only thing the log says.
pub fn check_web_config(config: &Config) -> Result<(), crate::config::ConfigError> {
    web_config(config).map(drop)
}

/// `http.web_config_file` loaded, or the configuration error that names what is wrong in it.
fn web_config(config: &Config) -> Result<WebConfigWatch, crate::config::ConfigError> {
    let path = config.http.web_config_file.clone();
    WebConfigWatch::new(path.clone()).map_err(|e| crate::config::ConfigError::Invalid {
        key: "http.web_config_file",
        value: path.map(|p| p.display().to_string()).unwrap_or_default(),
        reason: format!("{}: {}", e.key, e.reason),
    })
}

/// SIGHUP reads the web config again (certificates rotated, users changed); a bad file keeps
/// the one in force.
fn reload_on_sighup(web: Arc<WebConfigWatch>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reading the web config again");
            let web = web.clone();
            let _ = tokio::task::spawn_blocking(move || web.reload()).await;
        }
    });
    Ok(())
}

/// Cancels `token` on SIGINT or SIGTERM.
pub fn cancel_on_signals(token: CancellationToken) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        // Shutdown starts before anything else is done: nothing after this line can keep the
        // daemon running.
        token.cancel();
        tracing::info!("{name}: shutting down");
    });
    Ok(())
}
