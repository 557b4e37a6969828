//! The Processes table's rows: every NVML GPU process joined with the trainer session of the
//! same host pid, plus live trainers NVML does not list. Cells are formatted here, once per
//! update, so drawing a frame only copies text.

use std::cmp::Ordering;

use super::node::Node;
use crate::core::snapshot::SessionView;
use crate::frontends::tui::finding::{Finding, FindingView};
use crate::units::bytes;
use crate::util::printable::printable;

mod column;
mod reuse;

pub use column::Column;

/// Identifies a row across refreshes, so the selection follows it when rows move.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RowKey {
    pub node: usize,
    pub gpu: Option<u32>,
    pub pid: u32,
    pub session: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Badge {
    pub kind: &'static str,
    pub critical: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ProcRow {
    pub key: RowKey,
    pub used: Option<u64>,
    pub floor: Option<u64>,
    pub peak: Option<u64>,
    pub reserved: Option<u64>,
    pub frag: Option<f64>,
    /// NVML's figure minus reserved: memory of the process outside PyTorch's allocator.
    pub outside: Option<u64>,
    pub retries: Option<u64>,
    pub step: Option<u64>,
    /// The trainer's rank in its job.
    pub rank: Option<u64>,
    pub badges: Vec<Badge>,
    /// Display text of every column in `Column::ALL` order, one space between: one allocation a
    /// row instead of fifteen (a row was 600 bytes, moved at every refresh for 1,000 processes).
    text: String,
    /// Where each column's text ends in `text`.
    ends: [u32; 15],
    /// What a process row without a trainer was made from (reuse.rs); 0 for the others.
    inputs: u64,
}

impl ProcRow {
    pub fn cell(&self, c: Column) -> &str {
        let i = c.index();
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize + 1,
        };
        self.text
            .get(start..self.ends[i] as usize)
            .unwrap_or_default()
    }

    /// Whether the row's text, lower-cased, holds the filter's. Lower-cased here, only while a
    /// filter is typed, rather than kept for every row.
    pub fn matches(&self, needle_lower: &str) -> bool {
        needle_lower.is_empty() || self.text.to_lowercase().contains(needle_lower)
    }

    pub fn firing(&self) -> bool {
        !self.badges.is_empty()
    }
}

pub fn build(nodes: &[Node]) -> Vec<ProcRow> {
    build_reusing(nodes, Vec::new())
}

/// As `build`, taking each row of a process without a trainer from `old` when what it is made
/// from is unchanged: of 1,000 processes most hold their memory from one refresh to the next,
/// and formatting their cells was most of a refresh.
pub fn build_reusing(nodes: &[Node], old: Vec<ProcRow>) -> Vec<ProcRow> {
    let mut old = reuse::Old::new(old);
    let mut rows = Vec::with_capacity(old.count());
    for (n, node) in nodes.iter().enumerate() {
        let Some(snap) = &node.snap else { continue };
        let live: Vec<&SessionView> = snap.sessions.iter().filter(|s| s.ended.is_none()).collect();
        let mut matched = vec![false; live.len()];
        for p in &snap.processes {
            // The daemon joined the process to its session (host pid and device, MIG-aware).
            let found = p
                .session
                .as_ref()
                .and_then(|id| live.iter().position(|s| &s.session == id));
            if let Some(i) = found {
                matched[i] = true;
            }
            let sess = found.map(|i| live[i]);
            let badges = badges(sess, p.pid, Some(p.gpu), &node.findings);
            let inputs = match sess {
                None => reuse::inputs(n, &node.name, p, &badges),
                Some(_) => 0,
            };
            if let Some(row) = old.take(n, p, inputs) {
                rows.push(row);
                continue;
            }
            let mut r = Draft {
                node: n,
                node_name: &node.name,
                gpu: Some(p.gpu),
                pid: p.pid,
                user: p.info.user.clone(),
                container: p.info.container.clone(),
                name: p.info.name.clone(),
                used: p.used_memory_bytes,
            };
            if r.user.is_none() {
                r.user = sess.map(|s| s.uid.to_string());
            }
            let mut row = r.finish(sess, badges);
            row.inputs = inputs;
            rows.push(row);
        }
        for (s, _) in live.iter().zip(&matched).filter(|(_, m)| !**m) {
            let r = Draft {
                node: n,
                node_name: &node.name,
                gpu: s.gpu,
                pid: s.pid,
                user: Some(s.uid.to_string()),
                container: None,
                name: None,
                used: None,
            };
            let badges = badges(Some(s), s.pid, s.gpu, &node.findings);
            rows.push(r.finish(Some(s), badges));
        }
    }
    rows
}

struct Draft<'a> {
    node: usize,
    node_name: &'a str,
    gpu: Option<u32>,
    pid: u32,
    user: Option<String>,
    container: Option<String>,
    name: Option<String>,
    used: Option<u64>,
}

impl Draft<'_> {
    fn finish(self, s: Option<&SessionView>, badges: Vec<Badge>) -> ProcRow {
        let stats = s.and_then(|s| s.stats);
        let floor = s.and_then(latest_floor);
        let peak = stats.and_then(|x| x.allocated_peak);
        let reserved = stats.and_then(|x| x.reserved);
        let frag = stats.and_then(|x| x.fragmentation());
        let ledger = s.and_then(|s| s.ledger.as_ref());
        let outside = ledger.and_then(|l| l.outside_allocator_bytes);
        let retries = s.map(|s| s.alloc_retries_total);
        let step = s.and_then(|s| s.step);
        let pid = match s.and_then(|s| s.ns_pid) {
            Some(ns) if ns != u64::from(self.pid) => format!("{} ({ns})", self.pid),
            _ => self.pid.to_string(),
        };
        let name = match s {
            Some(s) => trainer_label(s, self.name.as_deref()),
            None => self.name.unwrap_or_else(|| "n/a".into()),
        };
        let b = |v: Option<u64>| v.map(bytes).unwrap_or_else(|| "-".into());
        let cells = [
            self.node_name.to_string(),
            self.gpu
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into()),
            pid,
            self.user.unwrap_or_else(|| "n/a".into()),
            self.container.unwrap_or_else(|| "-".into()),
            name,
            b(self.used),
            b(floor),
            b(peak),
            b(reserved),
            frag.map(|f| format!("{:.0}%", f * 100.0))
                .unwrap_or_else(|| "-".into()),
            // "?": a trainer whose outside part cannot be known (the API's ledger says why).
            match (outside, ledger) {
                (Some(o), _) => bytes(o),
                (None, Some(_)) => "?".into(),
                (None, None) => "-".into(),
            },
            retries.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
            step.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
            badges.iter().map(|b| b.kind).collect::<Vec<_>>().join(" "),
        ];
        let mut text = String::with_capacity(cells.iter().map(|c| c.len() + 1).sum());
        let mut ends = [0; 15];
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(c);
            ends[i] = u32::try_from(text.len()).unwrap_or(u32::MAX);
        }
        ProcRow {
            key: RowKey {
                node: self.node,
                gpu: self.gpu,
                pid: self.pid,
                session: s.map(|s| s.session.clone()),
            },
            used: self.used,
            floor,
            peak,
            reserved,
            frag,
            outside,
            retries,
            step,
            rank: s.and_then(|s| s.rank),
            badges,
            text,
            ends,
            inputs: 0,
        }
    }
}

/// "llama-ft r0/8", with the process name after it when NVML has one: "llama-ft r0/8 · python".
/// The job is the trainer's word: its control characters are shown escaped, not obeyed.
fn trainer_label(s: &SessionView, process: Option<&str>) -> String {
    let job = printable(s.job.as_deref().unwrap_or("trainer"));
    let rank = match (s.rank, s.world_size) {
        (Some(r), Some(w)) => format!(" r{r}/{w}"),
        (Some(r), None) => format!(" r{r}"),
        _ => String::new(),
    };
    match process {
        Some(p) => format!("{job}{rank} · {p}"),
        None => format!("{job}{rank}"),
    }
}

/// The allocated floor: `allocated` at the latest step boundary of a train sample.
pub fn latest_floor(s: &SessionView) -> Option<u64> {
    super::merge::window(s)
        .iter()
        .rev()
        .filter_map(|p| p.value)
        .find(|p| p.train)
        .and_then(|p| p.allocated)
        .or_else(|| s.stats.and_then(|x| x.allocated))
}

fn badges(s: Option<&SessionView>, pid: u32, gpu: Option<u32>, findings: &[Finding]) -> Vec<Badge> {
    let mut out: Vec<Badge> = findings
        .iter()
        .filter(|f| f.firing())
        .filter(|f| f.concerns(s.map(|s| s.session.as_str()), pid, gpu))
        .map(|f| Badge {
            kind: badge_kind(f),
            critical: f.critical(),
        })
        .collect();
    out.sort_by_key(|b| (!b.critical, b.kind));
    out.dedup();
    out
}

/// Badges name only the kinds the contract knows; anything newer shows as "other".
fn badge_kind(f: &Finding) -> &'static str {
    match f.badge() {
        "leak" => "leak",
        "near" => "near",
        "frag" => "frag",
        "oom" => "oom",
        "crash" => "crash",
        "outside" => "outside",
        "cache" => "cache",
        _ => "other",
    }
}

/// Orders two rows by `col`; values that are missing sort last whatever the direction.
pub fn compare(a: &ProcRow, b: &ProcRow, col: Column, desc: bool) -> Ordering {
    let by = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) => {
            let o = x.total_cmp(&y);
            if desc {
                o.reverse()
            } else {
                o
            }
        }
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    };
    let f = |v: Option<u64>| v.map(|x| x as f64);
    let text = |c: Column| {
        let o = a.cell(c).to_lowercase().cmp(&b.cell(c).to_lowercase());
        if desc {
            o.reverse()
        } else {
            o
        }
    };
    let primary = match col {
        Column::Gpu => by(a.key.gpu.map(f64::from), b.key.gpu.map(f64::from)),
        Column::Pid => by(Some(f64::from(a.key.pid)), Some(f64::from(b.key.pid))),
        Column::Used => by(f(a.used), f(b.used)),
        Column::Floor => by(f(a.floor), f(b.floor)),
        Column::Peak => by(f(a.peak), f(b.peak)),
        Column::Reserved => by(f(a.reserved), f(b.reserved)),
        Column::Frag => by(a.frag, b.frag),
        Column::Outside => by(f(a.outside), f(b.outside)),
        Column::Retries => by(f(a.retries), f(b.retries)),
        Column::Step => by(f(a.step), f(b.step)),
        Column::Findings => by(severity(a), severity(b)),
        other => text(other),
    };
    primary.then_with(|| {
        (a.key.node, a.key.gpu, a.key.pid, &a.key.session).cmp(&(
            b.key.node,
            b.key.gpu,
            b.key.pid,
            &b.key.session,
        ))
    })
}

/// Critical findings weigh more than any number of warnings.
fn severity(r: &ProcRow) -> Option<f64> {
    if r.badges.is_empty() {
        return None;
    }
    Some(
        r.badges
            .iter()
            .map(|b| if b.critical { 100.0 } else { 1.0 })
            .sum(),
    )
}
