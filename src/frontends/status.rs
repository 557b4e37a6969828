//! `gpumon status`: one look at the node, from the running daemon when there is one, else
//! straight from NVML (so it works before the daemon is installed).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

use crate::core::categories::split_text;
use crate::core::model::GpuState;
use crate::core::snapshot::{SessionView, Snapshot};
use crate::daemon_client::{normalize_url, ClientArgs, DaemonClient};
use crate::frontends::local::{LocalNode, Machine};
use crate::units::{bytes, opt};

mod jobs;
mod legend;
mod orphans;

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
    let snap = escaped.as_ref().unwrap_or(snap);
    let mut out = layout(snap, origin);
    legend::section(snap, &mut out);
    // A second guard, should a string have escaped the copy.
    crate::util::printable::printable_lines(&out).into_owned()
}

/// A unified device's state: which figure bounds its total, or why it has none.
fn unified_state(u: Option<&crate::core::model::UnifiedMemory>) -> String {
    match u.and_then(|u| u.bound()) {
        Some(b) if u.is_some_and(|u| u.memory().is_some()) => {
            format!("ok (unified; limit: {})", b.as_str())
        }
        _ => "ok (unified; limit n/a)".to_string(),
    }
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
            GpuState::Ok if r.unified.is_some() => unified_state(r.unified.as_ref()),
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
            // A unified device has no reserved figure (NVML gives no frame-buffer view of it).
            opt(m.filter(|_| r.unified.is_none()).map(|m| m.reserved), bytes),
            opt(m.map(|m| m.free), bytes),
            opt(m.map(|m| m.total), bytes),
            opt(r.utilization, |u| format!("{:.0}%", u * 100.0)),
            opt(r.temperature_celsius, |t| format!("{t:.0}C")),
            opt(r.power_watts, |w| format!("{w:.0}W")),
        );
    }
    jobs::section(snap, &mut out);
    trainers(snap, &mut out);
    orphans::section(snap, &mut out);
    if snap.processes.is_empty() {
        let _ = writeln!(out, "\nno GPU processes");
        return out;
    }
    let _ = writeln!(
        out,
        "\n{:<4} {:>8} {:<12} {:<14} {:<16} {:<16} {:>10}",
        "GPU", "PID", "USER", "CONTAINER", "PROCESS", "KIND", "USED"
    );
    // A row per process, thousands on a busy node: the cells are written straight into `out`
    // (what `{:<4} {:>8} {:<12} {:<14} {:<16} {:<16} {:>10}` wrote, without a String per cell).
    out.reserve(snap.processes.len() * 88);
    let mut cell = String::new();
    for p in &snap.processes {
        cell.clear();
        push_decimal(&mut cell, p.gpu.into());
        pad(&mut out, &cell, 4, Align::Left);
        out.push(' ');
        cell.clear();
        push_decimal(&mut cell, p.pid.into());
        pad(&mut out, &cell, 8, Align::Right);
        out.push(' ');
        fit(&mut out, p.info.user.as_deref().unwrap_or("n/a"), 12);
        out.push(' ');
        fit(&mut out, p.info.container.as_deref().unwrap_or("-"), 14);
        out.push(' ');
        fit(&mut out, p.info.name.as_deref().unwrap_or("n/a"), 16);
        out.push(' ');
        pad(&mut out, p.kind.as_str(), 16, Align::Left);
        out.push(' ');
        cell.clear();
        match p.used_memory_bytes {
            Some(b) => push_bytes(&mut cell, b),
            None => cell.push_str("n/a"),
        }
        pad(&mut out, &cell, 10, Align::Right);
        out.push('\n');
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
        legend::outside_unknown(s, out);
        memory(s, out);
    }
    for m in messages {
        let _ = writeln!(out, "  {}", truncate(&m, 160));
    }
}

/// Where the trainer's memory went at its latest measured step, under its row, when it sent a
/// split: "  memory: parameters 1.0 GiB, …, other 1.6 GiB (step 3, batch 16); largest safe
/// batch 15", then the partial reasons' codes when some figure is known to be off.
fn memory(s: &SessionView, out: &mut String) {
    let Some(split) = &s.categories else {
        return;
    };
    let _ = write!(out, "  memory: {}", split_text(split));
    match s.largest_safe_batch {
        Some(0) => out.push_str("; no batch fits"),
        Some(n) => {
            let _ = write!(out, "; largest safe batch {n}");
        }
        None => {}
    }
    let codes: Vec<&str> = split
        .measured
        .partial
        .iter()
        .map(|p| p.split(':').next().unwrap_or(p).trim())
        .collect();
    if !codes.is_empty() {
        let _ = write!(out, "; partial: {}", codes.join(", "));
    }
    out.push('\n');
}

/// `s` cut to `max` characters (at least 1), its last one then `~`; `s` itself when it fits.
fn truncate(s: &str, max: usize) -> Cow<'_, str> {
    match cut_at(s, max) {
        None => Cow::Borrowed(s),
        Some(end) => Cow::Owned(format!("{}~", &s[..end])),
    }
}

/// Where `s` is cut to fit `max` characters (the byte offset of its `max`th, which `~`
/// replaces); None when it fits.
fn cut_at(s: &str, max: usize) -> Option<usize> {
    if s.len() <= max {
        return None;
    }
    let mut starts = s.char_indices().map(|(i, _)| i);
    let end = starts.nth(max.checked_sub(1)?)?;
    starts.next().map(|_| end)
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// `s` padded with spaces to `width` characters, as `{:<width$}` or `{:>width$}` pads it
/// (counting characters, not bytes).
fn pad(out: &mut String, s: &str, width: usize, align: Align) {
    let chars = if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    };
    let fill = width.saturating_sub(chars);
    if let Align::Right = align {
        spaces(out, fill);
    }
    out.push_str(s);
    if let Align::Left = align {
        spaces(out, fill);
    }
}

fn spaces(out: &mut String, n: usize) {
    const SPACES: &str = "                                ";
    match SPACES.get(..n) {
        Some(run) => out.push_str(run),
        None => out.extend(std::iter::repeat_n(' ', n)),
    }
}

/// `truncate(s, width)` padded to `width` on the right, without a String for it.
fn fit(out: &mut String, s: &str, width: usize) {
    match cut_at(s, width) {
        None => pad(out, s, width, Align::Left),
        // The cut keeps width - 1 characters, and `~` makes the width.
        Some(end) => {
            out.push_str(&s[..end]);
            out.push('~');
        }
    }
}

fn push_decimal(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// What `units::bytes` writes ("512 B", "1.5 KiB", "79.6 GiB"), without its float formatting:
/// below 2^53 bytes the value in its unit is b / 2^(10 x unit) exactly, so its one decimal is
/// found in integers, rounded as float formatting rounds (to nearest, a tie to even).
fn push_bytes(out: &mut String, b: u64) {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if b >= 1 << 53 {
        // Not exact as an f64: its own rounding decides.
        out.push_str(&crate::units::bytes(b));
        return;
    }
    let unit = ((63 - b.max(1).leading_zeros()) / 10).min(5) as usize;
    if unit == 0 {
        push_decimal(out, b);
        out.push_str(" B");
        return;
    }
    let shift = 10 * unit as u32;
    let tenths = b * 10;
    let mut q = tenths >> shift;
    let rest = tenths & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rest > half || (rest == half && q % 2 == 1) {
        q += 1;
    }
    push_decimal(out, q / 10);
    out.push('.');
    out.push(char::from(b'0' + (q % 10) as u8));
    out.push(' ');
    out.push_str(UNITS[unit]);
}

#[cfg(test)]
mod tests;
