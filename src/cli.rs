//! Command line: `gpumon <command>`. Flags also read `GPUMON_*` variables; both override the file.

pub mod errors;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{parse_duration, Config, ConfigError, LogFormat};

#[derive(Debug, Parser)]
#[command(
    name = "gpumon",
    version,
    about = "Live GPU memory monitor for machines that train models"
)]
pub struct Cli {
    /// Config file (TOML). Default: /etc/gpumon/gpumon.toml when it exists.
    #[arg(long, global = true, env = "GPUMON_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Log output format.
    #[arg(long, global = true, env = "GPUMON_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Log filter, e.g. "info" or "gpumon=debug,gpumon_core=debug" (the domain core logs
    /// under its own crate).
    #[arg(long, global = true, env = "GPUMON_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Poll NVML, accept trainer stats, serve /metrics and the JSON API.
    Daemon(DaemonArgs),
    /// Print GPUs and their processes once, from a running daemon or straight from NVML.
    Status(StatusArgs),
    /// Print a commented example config file.
    Config,
    /// Live terminal dashboard: GPUs, processes, trainers and findings.
    Tui(TuiArgs),
    /// Replay recorded trace files through the detectors and report findings.
    Analyze(AnalyzeArgs),
    /// A simulated node with trainers (healthy, leaking, near the limit): no GPU needed.
    Demo(crate::frontends::demo::DemoArgs),
    /// One simulated trainer process (started by `gpumon demo`).
    #[command(hide = true)]
    DemoTrainer(crate::frontends::demo::TrainerArgs),
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: AnalyzeFormat,
    /// Trace files (one session each, hello first), as written by `gpumon daemon --record-dir`.
    #[arg(required = true, value_name = "TRACE")]
    pub traces: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AnalyzeFormat {
    Text,
    Json,
}

/// Settings shared by the commands that run or find a daemon.
#[derive(Debug, Default, Args)]
pub struct Overrides {
    /// HTTP listen address of the daemon.
    #[arg(long, env = "GPUMON_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// NVML library path or name.
    #[arg(long, env = "GPUMON_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<String>,
    /// Where the host's /proc is mounted.
    #[arg(long, env = "GPUMON_PROCFS", value_name = "PATH")]
    pub procfs: Option<PathBuf>,
    /// The name this node goes by (API, alerts, traces); default: the hostname.
    #[arg(long, env = "GPUMON_NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub common: Overrides,
    /// Trainer ingest socket path.
    #[arg(long, env = "GPUMON_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// NVML poll interval, e.g. 1s or 500ms.
    #[arg(long, env = "GPUMON_INTERVAL", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Option<Duration>,
    /// Record each trainer session as a trace file in this directory (for `gpumon analyze`);
    /// a relative path is taken from the current directory.
    #[arg(long, env = "GPUMON_RECORD_DIR", value_name = "DIR")]
    pub record_dir: Option<PathBuf>,
    /// Send findings to this Alertmanager (base URL, e.g. http://127.0.0.1:9093).
    #[arg(long, env = "GPUMON_ALERTMANAGER_URL", value_name = "URL")]
    pub alertmanager_url: Option<String>,
    /// POST findings as JSON to this URL.
    #[arg(long, env = "GPUMON_WEBHOOK_URL", value_name = "URL")]
    pub webhook_url: Option<String>,
    /// TLS and basic auth for the HTTP side, in Prometheus exporter-toolkit's web config format.
    #[arg(
        long = "web.config.file",
        env = "GPUMON_WEB_CONFIG_FILE",
        value_name = "PATH"
    )]
    pub web_config_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub common: Overrides,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub source: crate::frontends::status::SourceArgs,
}

#[derive(Debug, Args)]
pub struct TuiArgs {
    #[command(flatten)]
    pub common: Overrides,
    /// Daemon to show, as HOST:PORT, http://HOST:PORT or https://HOST:PORT; repeat for several
    /// nodes. Default:
    /// the local daemon at --listen, or NVML read in-process when none answers.
    #[arg(long, value_name = "URL")]
    pub connect: Vec<String>,
    /// How often to refresh, e.g. 1s or 500ms.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub refresh: Duration,
    #[command(flatten)]
    pub client: crate::daemon_client::ClientArgs,
}

impl Cli {
    /// The effective config for this invocation: file, then environment and flags on top.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        crate::config::env::check(std::env::vars_os().map(|(k, _)| k))?;
        let mut c = Config::load(self.config.as_deref())?;
        if let Some(v) = self.log_format {
            c.log_format = v;
        }
        if let Some(v) = &self.log_level {
            c.log_level = v.clone();
        }
        let common = match &self.command {
            Command::Daemon(d) => {
                if let Some(v) = &d.socket {
                    c.socket = Some(v.clone());
                }
                if let Some(v) = d.interval {
                    c.interval = v;
                }
                if let Some(v) = &d.record_dir {
                    // As the user means it, and as `gpumon demo` takes it: from the current
                    // directory. (An empty path stays empty, for the config's check to refuse.)
                    c.record.dir = Some(std::path::absolute(v).unwrap_or_else(|_| v.clone()));
                }
                if let Some(v) = &d.alertmanager_url {
                    c.alerts.alertmanager_url = Some(v.clone());
                }
                if let Some(v) = &d.webhook_url {
                    c.alerts.webhook_url = Some(v.clone());
                }
                if let Some(v) = &d.web_config_file {
                    c.http.web_config_file = Some(v.clone());
                }
                Some(&d.common)
            }
            Command::Status(s) => Some(&s.common),
            Command::Tui(t) => Some(&t.common),
            Command::Config | Command::Analyze(_) | Command::Demo(_) | Command::DemoTrainer(_) => {
                None
            }
        };
        if let Some(o) = common {
            if let Some(v) = o.listen {
                c.listen = v;
            }
            if let Some(v) = &o.nvml_lib {
                c.nvml_lib = v.clone();
            }
            if let Some(v) = &o.procfs {
                c.procfs = v.clone();
            }
            if let Some(v) = &o.node_name {
                c.node_name = Some(v.clone());
            }
        }
        c.validate()?;
        Ok(c)
    }
}
