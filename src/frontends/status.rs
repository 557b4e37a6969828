//! `gpumon status`: one look at the node, from the running daemon when there is one, else
//! straight from NVML (so it works before the daemon is installed).

use std::fmt::Write as _;
use std::time::Duration;

use crate::core::model::GpuState;
use crate::core::snapshot::Snapshot;
use crate::daemon_client::{normalize_url, ClientArgs, DaemonClient};
use crate::frontends::local::{LocalNode, Machine};
use crate::units::{bytes, opt};

/// The flags that choose where `gpumon status` looks (flattened into its command line).
#[derive(Debug, clap::Args)]
pub struct SourceArgs {
    /// Read NVML directly even if a daemon is running.
    #[arg(long)]
    pub direct: bool,
    /// The daemon to ask, as HOST:PORT, http://HOST:PORT or https://HOST:PORT. Default: the
    /// local daemon at --listen, or NVML directly when none answers.
    #[arg(long, value_name = "URL", conflicts_with = "direct")]
    pub connect: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Where the data came from, said in the table's first line.
pub enum Origin {
    Daemon(String),
    Direct { reason: String },
}

pub fn fetch(machine: &Machine, args: &SourceArgs) -> anyhow::Result<(Snapshot, Origin)> {
    let client = DaemonClient::new(&args.client, Duration::from_secs(2))?;
    if let Some(connect) = &args.connect {
        // A daemon named explicitly: its answer or its error, never the local NVML instead.
        let base = normalize_url(connect).map_err(anyhow::Error::msg)?;
        let url = format!("{base}/api/v1/snapshot");
        return from_daemon(&client, &url)
            .map(|s| (s, Origin::Daemon(url.clone())))
            .map_err(|e| anyhow::anyhow!("{url}: {e}"));
    }
    let direct = args.direct;
    let url = format!("http://{}/api/v1/snapshot", machine.listen);
    let mut tried = None;
    if !direct {
        match from_daemon(&client, &url) {
            Ok(s) => return Ok((s, Origin::Daemon(url))),
            Err(e) => {
                tracing::debug!(%url, error = %e, "no daemon; reading NVML directly");
                tried = Some(e);
            }
        }
    }
    // The daemon's own poller and aggregator, in this process, for one collection.
    let node = LocalNode::start(
        machine.nvml_lib.clone(),
        machine.procfs.clone(),
        machine.interval,
        1,
    )?;
    let (_, snap) = node
        .next_snapshot(0, Duration::from_secs(30))
        .ok_or_else(|| anyhow::anyhow!("NVML did not answer within 30 s"))?;
    if !snap.nvml.up {
        let e = snap.nvml.error.clone().unwrap_or_default();
        return Err(match &tried {
            // Neither source answered: say both, and where to go from here.
            Some(daemon) => anyhow::anyhow!(
                "no daemon answered at {url} ({daemon}), and NVML could not be read either: {e}. Start one with `gpumon daemon` (or point --listen at yours); on a machine without a GPU, `gpumon demo` shows everything on a simulated node"
            ),
            None => anyhow::anyhow!("{e}"),
        });
    }
    let reason = if direct {
        "--direct".to_string()
    } else {
        format!("no daemon answered at {url}")
    };
    Ok((snap, Origin::Direct { reason }))
}

fn from_daemon(client: &DaemonClient, url: &str) -> anyhow::Result<Snapshot> {
    Ok(client.get(url)?.body_mut().read_json::<Snapshot>()?)
}

/// The table `gpumon status` prints. Job names, process names, users, containers and finding
/// messages come from trainers and from /proc: every string is escaped for one line before it is
/// laid out, so none can clear the screen, retitle the window or forge a line (the JSON API keeps
/// the true strings).
pub fn table(snap: &Snapshot, origin: &Origin) -> String {
    let escaped = crate::util::printable::printable_copy(snap);
    let out = layout(escaped.as_ref().unwrap_or(snap), origin);
    // A second guard, should a string have escaped the copy.
    crate::util::printable::printable_lines(&out).into_owned()
}

fn layout(snap: &Snapshot, origin: &Origin) -> String {
    let mut out = String::new();
    let src = match origin {
        Origin::Daemon(url) => format!("daemon {url}"),
        Origin::Direct { reason } => format!("NVML directly ({reason})"),
    };
    let driver = snap.nvml.driver_version.as_deref().unwrap_or("n/a");
    let _ = writeln!(out, "{}  driver {driver}  from {src}", snap.hostname);
    if !snap.nvml.up {
        let why = snap.nvml.error.as_deref().unwrap_or("no poll yet");
        let _ = writeln!(out, "NVML is down: {why}");
    }
    let _ = writeln!(
        out,
        "\n{:<4} {:<26} {:>10} {:>10} {:>10} {:>10} {:>5} {:>6} {:>7}  STATE",
        "GPU", "NAME", "USED", "RESERVED", "FREE", "TOTAL", "UTIL", "TEMP", "POWER"
    );
    for g in &snap.gpus {
        let r = &g.reading;
        let m = r.memory;
        let state = match r.state {
            GpuState::Ok if r.mig_mode => "ok (MIG)".to_string(),
            GpuState::Ok => "ok".to_string(),
            GpuState::Lost => format!("LOST: {}", r.error.as_deref().unwrap_or("")),
            GpuState::Error => format!("ERROR: {}", r.error.as_deref().unwrap_or("")),
        };
        let _ = writeln!(
            out,
            "{:<4} {:<26} {:>10} {:>10} {:>10} {:>10} {:>5} {:>6} {:>7}  {state}",
            r.identity.index,
            truncate(&r.identity.name, 26),
            opt(m.map(|m| m.used), bytes),
            opt(m.map(|m| m.reserved), bytes),
            opt(m.map(|m| m.free), bytes),
            opt(m.map(|m| m.total), bytes),
            opt(r.utilization, |u| format!("{:.0}%", u * 100.0)),
            opt(r.temperature_celsius, |t| format!("{t:.0}C")),
            opt(r.power_watts, |w| format!("{w:.0}W")),
        );
    }
    trainers(snap, &mut out);
    if snap.processes.is_empty() {
        let _ = writeln!(out, "\nno GPU processes");
        return out;
    }
    let _ = writeln!(
        out,
        "\n{:<4} {:>8} {:<12} {:<14} {:<16} {:<16} {:>10}",
        "GPU", "PID", "USER", "CONTAINER", "PROCESS", "KIND", "USED"
    );
    for p in &snap.processes {
        let _ = writeln!(
            out,
            "{:<4} {:>8} {:<12} {:<14} {:<16} {:<16} {:>10}",
            p.gpu,
            p.pid,
            truncate(p.info.user.as_deref().unwrap_or("n/a"), 12),
            truncate(p.info.container.as_deref().unwrap_or("-"), 14),
            truncate(p.info.name.as_deref().unwrap_or("n/a"), 16),
            p.kind.as_str(),
            opt(p.used_memory_bytes, bytes),
        );
    }
    out
}

/// Live trainer sessions grouped by job (then rank), each with its open findings, and the
/// messages of those findings below: what an engineer asks first of a node.
fn trainers(snap: &Snapshot, out: &mut String) {
    let mut live: Vec<_> = snap.sessions.iter().filter(|s| s.ended.is_none()).collect();
    if live.is_empty() {
        return;
    }
    live.sort_by(|a, b| (&a.job, a.rank, a.pid).cmp(&(&b.job, b.rank, b.pid)));
    let open = |session: &str| -> Vec<&crate::core::detect::Finding> {
        snap.findings
            .iter()
            .filter(|f| f.subject.session == session && f.state.open())
            .collect()
    };
    let _ = writeln!(
        out,
        "\n{:<20} {:>6} {:>4} {:>8} {:>9} {:>10} {:>10} {:>10}  FINDINGS",
        "JOB", "RANK", "GPU", "PID", "STEP", "ALLOCATED", "RESERVED", "OUTSIDE"
    );
    let mut messages = Vec::new();
    for s in &live {
        let rank = match (s.rank, s.world_size) {
            (Some(r), Some(w)) => format!("{r}/{w}"),
            (Some(r), None) => r.to_string(),
            _ => "-".into(),
        };
        let found = open(&s.session);
        let badges: Vec<String> = found
            .iter()
            .map(|f| format!("{} {}", f.kind.as_str(), f.state.as_str()))
            .collect();
        for f in &found {
            if !f.message.is_empty() {
                messages.push(format!(
                    "{} {}: {}",
                    s.job.as_deref().unwrap_or("-"),
                    f.kind.as_str(),
                    f.message
                ));
            }
        }
        let _ = writeln!(
            out,
            "{:<20} {:>6} {:>4} {:>8} {:>9} {:>10} {:>10} {:>10}  {}",
            truncate(s.job.as_deref().unwrap_or("-"), 20),
            rank,
            opt(s.gpu, |g| g.to_string()),
            s.pid,
            opt(s.step, |v| v.to_string()),
            opt(s.stats.and_then(|st| st.allocated), bytes),
            opt(s.stats.and_then(|st| st.reserved), bytes),
            // Memory of the process outside PyTorch's allocator (the API's ledger says why
            // when it cannot be known: "?").
            match &s.ledger {
                Some(l) => l.outside_allocator_bytes.map_or("?".into(), bytes),
                None => "-".into(),
            },
            if badges.is_empty() {
                "-".to_string()
            } else {
                badges.join(", ")
            },
        );
    }
    for m in messages {
        let _ = writeln!(out, "  {}", truncate(&m, 160));
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('~');
        t
    }
}
