use std::process::ExitCode;

use gpumon::cli::{Cli, Command};
use gpumon::config::{Config, ConfigError, LogFormat};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = parse();
    if let Command::Config = cli.command {
        return match write_stdout(&gpumon::config::example()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error_line(&format!("gpumon config: cannot write to stdout: {e}"));
                ExitCode::FAILURE
            }
        };
    }
    if let Command::DemoTrainer(a) = &cli.command {
        return match gpumon::frontends::demo::run_trainer(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error_line(&format!("gpumon demo-trainer: {e:#}"));
                ExitCode::FAILURE
            }
        };
    }
    let config = match cli.resolve() {
        Ok(c) => c,
        Err(e) => {
            error_line(&format!("gpumon: {e}"));
            return ExitCode::from(ConfigError::EXIT_CODE);
        }
    };
    if let Command::Analyze(a) = &cli.command {
        // No log setup: findings go to stdout, and the per-finding log lines would only repeat them.
        return run_analyze(a, &config);
    }
    // The TUI owns the terminal: log lines on stderr would be drawn over it.
    let owns_terminal = match &cli.command {
        Command::Tui(_) => true,
        Command::Demo(d) => !d.headless && std::io::IsTerminal::is_terminal(&std::io::stdout()),
        _ => false,
    };
    // Held to the end: dropping it writes out the log lines still queued (for a second at most).
    let _log = (!owns_terminal).then(|| init_tracing(&config));
    let result = match cli.command {
        Command::Daemon(_) => run_daemon(config),
        Command::Status(s) => gpumon::frontends::status::fetch(&config.machine(), &s.source)
            .and_then(|(snap, origin)| {
                let out = if s.json {
                    json_ascii(serde_json::to_string_pretty(&snap)?) + "\n"
                } else {
                    gpumon::frontends::status::table(&snap, &origin)
                };
                write_stdout(&out)
                    .map_err(|e| anyhow::anyhow!("cannot write the status to stdout: {e}"))
            }),
        Command::Demo(d) => {
            let machine = config.machine();
            let tui: gpumon::frontends::demo::TuiFn = Box::new(move |url| {
                gpumon::frontends::tui::run(
                    &machine,
                    gpumon::frontends::tui::Options {
                        connect: vec![url],
                        refresh: std::time::Duration::from_secs(1),
                        client: gpumon::daemon_client::DaemonClient::plain(
                            std::time::Duration::from_secs(3),
                        ),
                    },
                )
            });
            let defaults = gpumon::frontends::demo::Defaults {
                listen: config.listen,
                record_dir: config.record.dir.clone(),
            };
            gpumon::frontends::demo::run(d, defaults, demo_daemon(config), Some(tui))
        }
        Command::Tui(t) => {
            gpumon::daemon_client::DaemonClient::new(&t.client, std::time::Duration::from_secs(3))
                .and_then(|client| {
                    gpumon::frontends::tui::run(
                        &config.machine(),
                        gpumon::frontends::tui::Options {
                            connect: t.connect,
                            refresh: t.refresh,
                            client,
                        },
                    )
                })
        }
        Command::Config | Command::Analyze(_) | Command::DemoTrainer(_) => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error_line(&format!("gpumon: {e:#}"));
            // What only a config change can fix is final for systemd (RestartPreventExitStatus).
            if e.downcast_ref::<ConfigError>().is_some() {
                ExitCode::from(ConfigError::EXIT_CODE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn run_analyze(a: &gpumon::cli::AnalyzeArgs, config: &Config) -> ExitCode {
    let (report, errors) = gpumon::frontends::analyze::analyze(&a.traces, config.detect());
    let out = match a.format {
        gpumon::cli::AnalyzeFormat::Json => {
            json_ascii(
                serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
            ) + "\n"
        }
        gpumon::cli::AnalyzeFormat::Text => gpumon::frontends::analyze::text(&report),
    };
    if let Err(e) = write_stdout(&out) {
        error_line(&format!(
            "gpumon analyze: cannot write the report to stdout: {e}"
        ));
        return ExitCode::from(2);
    }
    for e in &errors {
        error_line(&format!("gpumon analyze: {e}"));
    }
    if !errors.is_empty() {
        ExitCode::from(2)
    } else if report
        .traces
        .iter()
        .flat_map(|t| &t.findings)
        // A stop is how a run ended, not something wrong with it.
        .any(|f| f.kind != gpumon::core::detect::Kind::Stopped)
    {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// An error on stderr, through the one escaping rule (`gpumon::util::printable`): errors quote
/// what a daemon, a trainer or a file said (serde's "unknown variant `…`" quotes the value), and
/// none of it may drive the terminal or start a line of its own.
fn error_line(s: &str) {
    gpumon::util::stderr::line(&gpumon::util::printable::printable(s));
}

/// JSON gpumon wrote, for a terminal as much as a program: the characters the escaping rule
/// names, which serde_json leaves raw, written as `\uXXXX` (the same document to a decoder).
fn json_ascii(json: String) -> String {
    match gpumon::util::printable::json_ascii(&json) {
        std::borrow::Cow::Borrowed(_) => json,
        std::borrow::Cow::Owned(o) => o,
    }
}

/// Writes `out` to stdout. A reader that closed early (`gpumon status | head`) is not an error:
/// `print!` would panic on the broken pipe, since Rust ignores SIGPIPE.
fn write_stdout(out: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Raises the soft open-files limit to the hard one: the default soft limit (1024) is below
/// `ingest.max_connections` plus HTTP, and the cap should be what refuses a client, not EMFILE.
///
/// Then says so when the two caps together do not fit under it: HTTP clients could then take the
/// fds a trainer's connection needs (the caps are what should refuse, and HTTP's first).
fn raise_fd_limit(config: &gpumon::config::Config) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    // None is unlimited: nothing to raise then.
    if let (Some(cur), Some(max)) = (lim.current, lim.maximum) {
        if cur < max {
            let raised = Rlimit {
                current: Some(max),
                maximum: Some(max),
            };
            if setrlimit(Resource::Nofile, raised).is_err() {
                tracing::warn!("could not raise the open-files limit; connections may fail with EMFILE before ingest.max_connections");
            }
        }
    }
    // Trace files, NVML's device nodes, /proc reads and the listeners, with room to spare.
    const OWN_FDS: u64 = 256;
    let (http, ingest) = (
        config.http.connection_limit as u64,
        config.ingest.max_connections as u64,
    );
    if let Some(limit) = getrlimit(Resource::Nofile).current {
        if http + ingest + OWN_FDS > limit {
            tracing::warn!(
                limit,
                http.connection_limit = http,
                ingest.max_connections = ingest,
                "http.connection_limit + ingest.max_connections + {OWN_FDS} is over the open-files limit: clients may be refused by EMFILE instead of the caps; lower them or raise LimitNOFILE"
            );
        }
    }
}

/// The command line, or the process ends with clap's error, rewritten where clap would name a
/// flag the user never typed or suggest a hidden subcommand.
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let cmd = Cli::command();
    let args: Vec<String> = std::env::args().collect();
    let explain = |e| {
        exit_with(gpumon::cli::errors::explain(e, &cmd, &args, |k| {
            std::env::var(k).ok()
        }))
    };
    match cmd.clone().try_get_matches() {
        Ok(m) => Cli::from_arg_matches(&m).unwrap_or_else(explain),
        Err(e) => explain(e),
    }
}

/// Ends the process with clap's message. clap quotes what was typed (a value, an unknown
/// argument or subcommand) as it was: those quotes are escaped by the one rule every other
/// output follows before clap lays out its message, and the message is written plain (clap's
/// colours would pass what was typed to the terminal as it was).
fn exit_with(mut e: clap::Error) -> ! {
    use clap::error::ContextValue;
    use gpumon::util::printable::{printable, printable_lines};
    if !e.use_stderr() {
        // Help and version: gpumon's own text.
        e.exit()
    }
    let typed: Vec<_> = e.context().map(|(k, v)| (k, v.clone())).collect();
    for (kind, value) in typed {
        let escaped = match value {
            ContextValue::String(s) => ContextValue::String(printable(&s).into_owned()),
            ContextValue::Strings(v) => {
                ContextValue::Strings(v.iter().map(|s| printable(s).into_owned()).collect())
            }
            _ => continue,
        };
        e.insert(kind, escaped);
    }
    let text = e.render().to_string();
    gpumon::util::stderr::line(&printable_lines(text.trim_end()));
    std::process::exit(e.exit_code())
}

fn run_daemon(config: Config) -> anyhow::Result<()> {
    match gpumon::sources::procinfo::check_root(&config.procfs) {
        Err(reason) => {
            return Err(ConfigError::Invalid {
                key: "procfs",
                value: config.procfs.display().to_string(),
                reason,
            }
            .into())
        }
        Ok(Some(warning)) => tracing::warn!(procfs = %config.procfs.display(), "{warning}"),
        Ok(None) => {}
    }
    if let Some(n) = config.history.process_points {
        tracing::warn!(
            value = n,
            "history.process_points is ignored: gpumon keeps no per-process history (nothing read it); remove the key"
        );
    }
    raise_fd_limit(&config);
    gpumon::malloc::return_large_buffers();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot listen on {}: {e}; pick another --listen address",
                    config.listen
                )
            })?;
        // Signals first: a SIGTERM that comes as soon as the socket is ready must still end the
        // daemon cleanly (and remove the socket file), not kill it.
        let shutdown = CancellationToken::new();
        gpumon::daemon::cancel_on_signals(shutdown.clone())?;
        gpumon::daemon::check_web_config(&config)?;
        // Dropped after the daemon has stopped: the socket file goes with it.
        let (ingest, _socket_file) = open_ingest(&config)?;
        let source = Box::new(gpumon::sources::nvml::NvmlSource::new(
            config.nvml_lib.clone(),
            config.procfs.clone(),
        ));
        gpumon::daemon::run(config, listener, ingest, source, shutdown).await
    })
}

/// The daemon `gpumon demo` runs: this config, pointed at the demo's simulated node. Signals are
/// hooked before the daemon's run is spawned, as `run_daemon` hooks them before it serves.
fn demo_daemon(mut config: Config) -> gpumon::frontends::demo::DaemonFn {
    Box::new(move |parts| {
        config.nvml_lib = parts.nvml_lib;
        config.socket = Some(parts.socket);
        config.record.dir = parts.record_dir;
        gpumon::daemon::cancel_on_signals(parts.shutdown.clone())?;
        let source = Box::new(gpumon::sources::nvml::NvmlSource::new(
            config.nvml_lib.clone(),
            config.procfs.clone(),
        ));
        Ok(Box::pin(gpumon::daemon::run(
            config,
            parts.listener,
            Some(parts.ingest),
            source,
            parts.shutdown,
        )))
    })
}

/// The ingest socket: inherited from systemd (which owns the file), or bound at the configured
/// or default path, with the guard that removes the file on exit.
fn open_ingest(
    config: &Config,
) -> anyhow::Result<(
    Option<tokio::net::UnixListener>,
    Option<gpumon::sources::ingest::socket::SocketFile>,
)> {
    use gpumon::sources::ingest::socket;
    if let Some(l) = socket::from_systemd()? {
        tracing::info!("ingest socket inherited from systemd");
        return Ok((Some(l), None));
    }
    let Some(path) = config.socket.clone().or_else(socket::default_path) else {
        tracing::warn!("no ingest socket: /run/gpumon is not writable and XDG_RUNTIME_DIR is unset; set --socket");
        return Ok((None, None));
    };
    let listener = socket::bind(&path).map_err(|e| match e {
        // Only another path fixes it: final for systemd, like any configuration error.
        socket::BindError::Path { path, reason } => ConfigError::Invalid {
            key: "socket",
            value: path.display().to_string(),
            reason,
        }
        .into(),
        socket::BindError::Other(e) => e,
    })?;
    let file = socket::SocketFile::claim(&path);
    tracing::info!(socket = %path.display(), "ingest socket ready");
    Ok((Some(listener), Some(file)))
}

/// The log, written to stderr by a thread of its own through a bounded queue: a stderr that
/// blocks (a stalled pipe reader) or fails (a reader gone) then costs log lines, counted in
/// `gpumon_log_lost_total`, never a stalled or panicking daemon.
fn init_tracing(config: &Config) -> tracing_appender::non_blocking::WorkerGuard {
    // Validated in Config::validate, so the fallback is never taken.
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal, and never under NO_COLOR: logs often go to files and journald.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("gpumon-log")
        .finish(gpumon::util::stderr::Stderr);
    gpumon::util::stderr::count_dropped(writer.error_counter());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .log_internal_errors(false);
    match config.log_format {
        // JSON-escaped by serde_json, but C1 controls, bidi and invisible characters raw: the
        // log is `cat` to a terminal too.
        LogFormat::Json => builder
            .with_writer(gpumon::util::printable::JsonAscii(writer))
            .json()
            .init(),
        // A trainer's strings reach log lines (finding messages, job names): escaped there as on
        // `gpumon status`.
        LogFormat::Text => builder
            .with_writer(writer)
            .fmt_fields(gpumon::util::printable::LogFields)
            .init(),
    }
    guard
}

/// Log lines queued for stderr before new ones are dropped: a burst of findings fits, a stalled
/// reader costs at most this many lines of memory.
const LOG_QUEUE_LINES: usize = 1_024;
