//! Overview: one block per GPU (memory gauge split used / reserved / free, utilization,
//! temperature, power, and a sparkline of used memory), or one line per GPU when blocks do not
//! fit beside the trainer table, which has the room first; several nodes are listed one after
//! the other under a heading each.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Sparkline};
use ratatui::Frame;

use super::fmt::{ago, plural};
use super::gauge::gauge;
use super::gpu_list::{listed_lines, listing};
use super::notice;
use super::spark::{buckets, short, spark_range};
use super::theme::{Theme, FREE, RESERVED, USED};
use super::trainers_panel::{live, trainers};
use crate::core::model::GpuState;
use crate::core::snapshot::GpuView;
use crate::frontends::tui::app::state::{App, Link, Node, Origin};
use crate::units::bytes;

/// A full GPU block: border, gauge, legend, readings and at least one sparkline row.
const BLOCK_MIN: u16 = 6;

pub fn render(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    if app.multi_node() {
        return nodes(f, area, app, t);
    }
    let Some(node) = app.nodes.first() else {
        return;
    };
    let Some(snap) = &node.snap else {
        return notice(f, area, waiting(node, app, t));
    };
    if !snap.nvml.up {
        let why = snap
            .nvml
            .error
            .clone()
            .unwrap_or_else(|| "no poll yet".into());
        return notice(
            f,
            area,
            vec![
                Line::styled("NVML is down", t.crit()),
                Line::from(why),
                Line::styled(
                    format!(
                        "library {}; retried with backoff, GPUs appear here when it answers",
                        snap.nvml.library
                    ),
                    t.dim(),
                ),
            ],
        );
    }
    if snap.gpus.is_empty() {
        let driver = snap
            .nvml
            .driver_version
            .clone()
            .unwrap_or_else(|| "n/a".into());
        return notice(
            f,
            area,
            vec![
                Line::styled("No GPUs", t.bold()),
                Line::from(format!(
                    "NVML is up (driver {driver}) but lists no GPU on this node."
                )),
            ],
        );
    }
    let n = snap.gpus.len() as u16;
    let cols: u16 = if area.width >= 120 && n > 1 { 2 } else { 1 };
    let rows = n.div_ceil(cols);
    // The trainer table comes before the charts: it answers which trainer has a problem. Its
    // rows (header and border included) are kept for it; the GPUs take the rest.
    let (live, firing) = live(app);
    let table = if live > 0 {
        (live as u16).saturating_add(2)
    } else {
        0
    };
    let spare = area.height.saturating_sub(table);
    let gpus_h = if rows * BLOCK_MIN <= spare {
        // Blocks, grown into the rest instead of leaving it blank.
        let h = spare / rows;
        let w = area.width / cols;
        for (i, g) in snap.gpus.iter().enumerate() {
            let (r, c) = (i as u16 / cols, i as u16 % cols);
            let width = if c + 1 == cols { area.width - c * w } else { w };
            // The last row takes what the division left over.
            let height = if r + 1 == rows { spare - r * h } else { h };
            let rect = Rect::new(area.x + c * w, area.y + r * h, width, height);
            block(f, rect, app, node, g, t);
        }
        spare
    } else if live > 0 {
        // One line per GPU. Too many trainers for all: the firing ones come before the GPU
        // lines, which come before the quiet trainers; a few GPU lines stay (the rest scroll).
        let must = (firing.max(1) as u16).saturating_add(3);
        let h = n
            .min(area.height.saturating_sub(must))
            .max(n.min(2))
            .min(area.height);
        listing(f, Rect { height: h, ..area }, app, t);
        h
    } else {
        listing(f, area, app, t);
        area.height
    };
    let rest = Rect {
        y: area.y + gpus_h,
        height: area.height.saturating_sub(gpus_h),
        ..area
    };
    trainers(f, rest, app, t);
}

/// Several nodes: their GPUs one a line under a heading each, then the trainer table across
/// them (one job over several nodes is one job there). As for one node with many GPUs, a
/// problem's lines come before the GPU lines, which come before the quiet trainers.
fn nodes(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let (live, firing) = live(app);
    if live == 0 {
        return listing(f, area, app, t);
    }
    let gpus = listed_lines(app) as u16;
    let must = (firing.max(1) as u16).saturating_add(3);
    let h = gpus
        .min(area.height.saturating_sub(must))
        .max(gpus.min(2))
        .min(area.height);
    listing(f, Rect { height: h, ..area }, app, t);
    let rest = Rect {
        y: area.y + h,
        height: area.height.saturating_sub(h),
        ..area
    };
    trainers(f, rest, app, t);
}

fn waiting(node: &Node, app: &App, t: Theme) -> Vec<Line<'static>> {
    match (&node.link, &node.origin) {
        (
            Link::Down {
                error,
                retry_in_s,
                attempt,
                since,
            },
            Origin::Daemon { url },
        ) => vec![
            Line::styled(format!("Disconnected from {url}"), t.crit()),
            Line::from(error.clone()),
            Line::styled(
                format!(
                    "since {}; retrying in {retry_in_s}s (attempt {attempt})",
                    ago(app.now, *since)
                ),
                t.dim(),
            ),
        ],
        (_, Origin::Daemon { url }) => vec![Line::from(format!("Connecting to {url}…"))],
        (_, Origin::InProcess { .. }) => vec![Line::from("Reading NVML…")],
    }
}

/// A unified GPU's memory: its processes' sum, and the host's room for more, which figure named.
fn unified_line(
    m: crate::core::model::MemoryInfo,
    u: Option<&crate::core::model::UnifiedMemory>,
    t: Theme,
) -> Line<'static> {
    let from = match u.and_then(|u| u.bound()) {
        Some(crate::core::model::LimitFrom::CgroupMax) => "cgroup memory limit",
        _ => "host MemAvailable",
    };
    Line::from(vec![
        Span::styled(USED, t.used()),
        Span::raw(format!(" used {}  ", bytes(m.used))),
        Span::styled(FREE, t.free()),
        Span::raw(format!(" free {} ({from})  ", bytes(m.free))),
        Span::styled(format!("of {} unified", bytes(m.total)), t.dim()),
    ])
}

fn block(f: &mut Frame, area: Rect, app: &App, node: &Node, g: &GpuView, t: Theme) {
    let r = &g.reading;
    let stale = matches!(node.link, Link::Down { .. });
    let mut title = vec![Span::styled(
        format!(" GPU {} · {} ", r.identity.index, r.identity.name),
        t.bold(),
    )];
    if r.mig_mode {
        title.push(Span::styled("MIG ", t.accent()));
    }
    if r.unified.is_some() {
        title.push(Span::styled("unified ", t.accent()));
    }
    if stale {
        title.push(Span::styled("stale ", t.warn()));
    }
    let b = Block::bordered()
        .border_style(t.border())
        .title(Line::from(title))
        .title_bottom(Line::styled(" used memory, last 5 min ", t.dim()).right_aligned());
    let inner = b.inner(area);
    f.render_widget(b, area);
    let mut lines = Vec::new();
    match (r.state, r.memory) {
        (GpuState::Ok, Some(m)) if r.unified.is_some() => {
            lines.push(gauge(m.used, 0, m.total, inner.width, t));
            lines.push(unified_line(m, r.unified.as_ref(), t));
        }
        (GpuState::Ok, Some(m)) => {
            lines.push(gauge(m.used, m.reserved, m.total, inner.width, t));
            lines.push(Line::from(vec![
                Span::styled(USED, t.used()),
                Span::raw(format!(" used {}  ", bytes(m.used))),
                Span::styled(RESERVED, t.reserved()),
                Span::raw(format!(" reserved {}  ", bytes(m.reserved))),
                Span::styled(FREE, t.free()),
                Span::raw(format!(" free {}  ", bytes(m.free))),
                Span::styled(format!("of {}", bytes(m.total)), t.dim()),
            ]));
        }
        (GpuState::Ok, None) if r.unified.is_some() => lines.push(Line::styled(
            "unified memory: used or limit n/a (a process's memory or the host's not reported)",
            t.dim(),
        )),
        (GpuState::Ok, None) => lines.push(Line::styled("memory n/a", t.dim())),
        (state, _) => {
            let what = if state == GpuState::Lost {
                "LOST"
            } else {
                "ERROR"
            };
            lines.push(Line::styled(
                format!("{what}: {}", r.error.as_deref().unwrap_or("cannot be read")),
                t.crit(),
            ));
            lines.push(Line::styled("the other GPUs are still monitored", t.dim()));
        }
    }
    lines.push(readings(node, g, t));
    f.render_widget(Paragraph::new(lines), inner);
    let spark = Rect {
        y: inner.y + 3,
        height: inner.height.saturating_sub(3),
        ..inner
    };
    if spark.height == 0 {
        return;
    }
    let total = r.memory.map(|m| m.total).unwrap_or(0);
    let data = node
        .history
        .get(&r.identity.uuid)
        .map(|h| {
            buckets(
                h.iter().copied(),
                app.now,
                usize::from(spark.width.saturating_sub(LABEL)),
            )
        })
        .unwrap_or_default();
    let Some((lo, hi)) = spark_range(&data, total) else {
        return;
    };
    // The scale beside the sparkline: its top and bottom values.
    let mut labels = vec![Line::styled(short(hi), t.dim())];
    if spark.height > 1 {
        labels.resize(usize::from(spark.height) - 1, Line::from(""));
        labels.push(Line::styled(short(lo), t.dim()));
    }
    f.render_widget(
        Paragraph::new(labels),
        Rect {
            width: LABEL.min(spark.width),
            ..spark
        },
    );
    let rest = Rect {
        x: spark.x + LABEL,
        width: spark.width.saturating_sub(LABEL),
        ..spark
    };
    let x = rest.right() - data.len() as u16;
    let rect = Rect {
        x,
        width: data.len() as u16,
        ..rest
    };
    let shifted: Vec<Option<u64>> = data
        .iter()
        .map(|v| v.map(|v| v.saturating_sub(lo)))
        .collect();
    f.render_widget(
        Sparkline::default()
            .data(shifted)
            .max((hi - lo).max(1))
            .style(t.used())
            .absent_value_symbol("·")
            .absent_value_style(t.dim()),
        rect,
    );
}

/// Width of the sparkline's scale labels.
const LABEL: u16 = 7;

fn readings(node: &Node, g: &GpuView, t: Theme) -> Line<'static> {
    let r = &g.reading;
    let mut s = vec![Span::raw(format!(
        "util {} · {} · {}",
        r.utilization
            .map(|u| format!("{:.0}%", u * 100.0))
            .unwrap_or_else(|| "n/a".into()),
        r.temperature_celsius
            .map(|c| format!("{c:.0}°C"))
            .unwrap_or_else(|| "temp n/a".into()),
        r.power_watts
            .map(|w| format!("{w:.0} W"))
            .unwrap_or_else(|| "power n/a".into()),
    ))];
    // Firing before the counts: in a half-width block it is what must not be cut off.
    let firing = node.firing_on(g);
    if firing > 0 {
        s.push(Span::raw(" · "));
        s.push(Span::styled(format!("{firing} firing"), t.crit()));
    }
    if let Some(snap) = &node.snap {
        let procs = snap
            .processes
            .iter()
            .filter(|p| p.gpu == r.identity.index)
            .count();
        let trainers = snap
            .sessions
            .iter()
            .filter(|s| s.ended.is_none() && s.gpu == Some(r.identity.index))
            .count();
        s.push(Span::styled(
            format!(
                " · {} · {}",
                plural(procs as u64, "process"),
                plural(trainers as u64, "trainer")
            ),
            t.dim(),
        ));
    }
    Line::from(s)
}
