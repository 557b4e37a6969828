use std::process::ExitCode;

use clap::Parser;
use gpumon::cli::{Cli, Command};
use gpumon::config::{Config, LogFormat};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Config = cli.command {
        print!("{}", gpumon::config::example());
        return ExitCode::SUCCESS;
    }
    let config = match cli.resolve() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpumon: {e}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&config);
    let result = match cli.command {
        Command::Daemon(_) => run_daemon(config),
        Command::Status(s) => {
            gpumon::status::fetch(&config, s.direct).and_then(|(snap, origin)| {
                if s.json {
                    println!("{}", serde_json::to_string_pretty(&snap)?);
                } else {
                    print!("{}", gpumon::status::table(&snap, &origin));
                }
                Ok(())
            })
        }
        Command::Config => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpumon: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_daemon(config: Config) -> anyhow::Result<()> {
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
        let ingest = open_ingest(&config)?;
        let shutdown = CancellationToken::new();
        gpumon::daemon::cancel_on_signals(shutdown.clone())?;
        let source = Box::new(gpumon::sources::nvml::NvmlSource::new(
            config.nvml_lib.clone(),
            config.procfs.clone(),
        ));
        gpumon::daemon::run(config, listener, ingest, source, shutdown).await
    })
}

/// The ingest socket: inherited from systemd, or bound at the configured or default path.
fn open_ingest(config: &Config) -> anyhow::Result<Option<tokio::net::UnixListener>> {
    use gpumon::ingest::socket;
    if let Some(l) = socket::from_systemd()? {
        tracing::info!("ingest socket inherited from systemd");
        return Ok(Some(l));
    }
    let Some(path) = config.socket.clone().or_else(socket::default_path) else {
        tracing::warn!("no ingest socket: /run/gpumon is not writable and XDG_RUNTIME_DIR is unset; set --socket");
        return Ok(None);
    };
    let listener = socket::bind(&path)?;
    tracing::info!(socket = %path.display(), "ingest socket ready");
    Ok(Some(listener))
}

fn init_tracing(config: &Config) {
    // Validated in Config::validate, so the fallback is never taken.
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal, and never under NO_COLOR: logs often go to files and journald.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
