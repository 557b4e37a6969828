//! Overview: one block per GPU (memory gauge split used / reserved / free, utilization,
//! temperature, power, and a sparkline of used memory), or one line per GPU when blocks do not
//! fit; several nodes are listed one after the other under a heading each.

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;

use super::fmt::{ago, clip, plural};
use super::header::disconnected;
use super::notice;
use super::theme::{Theme, FREE, RESERVED, USED};
use crate::model::{GpuState, Timestamp};
use crate::snapshot::GpuView;
use crate::tui::app::rows::{compare, Column, ProcRow};
use crate::tui::app::state::{authority, App, Link, Node, Origin, HISTORY_SECS};
use crate::units::bytes;

/// A full GPU block: border, gauge, legend, readings and at least one sparkline row.
const BLOCK_MIN: u16 = 6;
const BLOCK_MAX: u16 = 10;

pub fn render(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    if app.multi_node() {
        return listing(f, area, app, t);
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
    if rows * BLOCK_MIN <= area.height {
        let h = (area.height / rows).min(BLOCK_MAX);
        let w = area.width / cols;
        for (i, g) in snap.gpus.iter().enumerate() {
            let (r, c) = (i as u16 / cols, i as u16 % cols);
            let width = if c + 1 == cols { area.width - c * w } else { w };
            let rect = Rect::new(area.x + c * w, area.y + r * h, width, h);
            block(f, rect, app, node, g, t);
        }
        let used = rows * h;
        let rest = Rect {
            y: area.y + used,
            height: area.height - used,
            ..area
        };
        if rest.height >= 4 {
            trainers(f, rest, app, t);
        }
    } else {
        listing(f, area, app, t);
    }
}

/// Live trainers, those with firing findings first: what to look at, below the GPUs when
/// there is room.
fn trainers(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let mut rows: Vec<&ProcRow> = app
        .procs
        .rows
        .iter()
        .filter(|r| r.key.session.is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    rows.sort_by(|a, b| compare(a, b, Column::Findings, true));
    let area = Rect {
        height: area.height.min(rows.len() as u16 + 3),
        ..area
    };
    let cols = [
        (Column::Name, 26),
        (Column::Gpu, 4),
        (Column::Pid, 12),
        (Column::Step, 8),
        (Column::Floor, 10),
        (Column::Peak, 10),
        (Column::Reserved, 10),
        (Column::Frag, 5),
        (Column::Findings, 12),
    ];
    let header = Row::new(
        cols.iter()
            .map(|(c, w)| Cell::from(Line::styled(pad(c.title(), *c, *w), t.bold()))),
    );
    let body = rows.iter().map(|r| {
        Row::new(cols.iter().map(|(c, w)| {
            if *c == Column::Findings {
                let spans: Vec<Span> = r
                    .badges
                    .iter()
                    .flat_map(|b| [Span::styled(b.kind, t.severity(b.critical)), Span::raw(" ")])
                    .collect();
                Cell::from(Line::from(spans))
            } else {
                Cell::from(pad(r.cell(*c), *c, *w))
            }
        }))
    });
    let widths = cols.iter().map(|(_, w)| Constraint::Length(*w as u16));
    let title = Line::from(vec![
        Span::styled(format!(" Trainers {} ", rows.len()), t.bold()),
        Span::styled("· enter on Processes for the chart ", t.dim()),
    ]);
    f.render_widget(
        Table::new(body, widths)
            .header(header)
            .column_spacing(1)
            .block(Block::bordered().border_style(t.border()).title(title)),
        area,
    );
}

fn pad(s: &str, c: Column, w: usize) -> String {
    let s = clip(s, w);
    if c.numeric() {
        format!("{s:>w$}")
    } else {
        s
    }
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

/// The range a sparkline spans: the window's own, so a climb is visible, but never narrower than
/// 2% of the GPU, so noise does not look like a cliff; the lowest value keeps a visible bar.
fn spark_range(data: &[Option<u64>], total: u64) -> Option<(u64, u64)> {
    let lo = data.iter().flatten().min().copied()?;
    let hi = data.iter().flatten().max().copied()?;
    let span = (hi - lo).max(total / 50).max(1);
    Some((hi.saturating_sub(span + span / 4), hi))
}

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
    let firing = gpu_firing(node, g);
    if firing > 0 {
        s.push(Span::raw(" · "));
        s.push(Span::styled(format!("{firing} firing"), t.crit()));
    }
    Line::from(s)
}

fn gpu_firing(node: &Node, g: &GpuView) -> usize {
    let idx = g.reading.identity.index.to_string();
    node.findings
        .iter()
        .filter(|f| f.firing())
        .filter(|f| {
            f.gpu.as_deref() == Some(idx.as_str())
                || f.gpu_uuid.as_deref() == Some(g.reading.identity.uuid.as_str())
        })
        .count()
}

/// Used, then reserved by the driver, then free, in proportion to the total.
fn gauge(used: u64, reserved: u64, total: u64, width: u16, t: Theme) -> Line<'static> {
    let w = usize::from(width);
    let part = |b: u64| {
        if total == 0 {
            0
        } else {
            ((b as f64 / total as f64) * w as f64).round() as usize
        }
    };
    let res = if reserved > 0 {
        part(reserved).max(1)
    } else {
        0
    }
    .min(w);
    let used = part(used).min(w - res);
    let free = w - res - used;
    Line::from(vec![
        Span::styled(USED.repeat(used), t.used()),
        Span::styled(RESERVED.repeat(res), t.reserved()),
        Span::styled(FREE.repeat(free), t.free()),
    ])
}

/// Splits the last `HISTORY_SECS` into at most `width` buckets of at least a second.
pub fn buckets(
    points: impl Iterator<Item = (Timestamp, Option<u64>)>,
    now: Timestamp,
    width: usize,
) -> Vec<Option<u64>> {
    if width == 0 {
        return Vec::new();
    }
    let span = (HISTORY_SECS / width as f64).max(1.0);
    let start = now - span * width as f64;
    let mut out: Vec<Option<Option<u64>>> = vec![None; width];
    let mut first = width;
    for (ts, v) in points {
        if ts <= start {
            continue;
        }
        let i = (((ts - start) / span).ceil() as usize)
            .saturating_sub(1)
            .min(width - 1);
        first = first.min(i);
        out[i] = Some(match (out[i].flatten(), v) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        });
    }
    // A bucket no poll fell into (timer jitter) repeats its neighbour; only real gaps show.
    let mut last = None;
    out.into_iter()
        .skip(first)
        .map(|b| {
            let v = b.unwrap_or(last);
            last = v;
            v
        })
        .collect()
}

/// One line per GPU, under a heading per node: the overview for many GPUs or many nodes.
fn listing(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let mut lines: Vec<Line> = Vec::new();
    for node in &app.nodes {
        if app.multi_node() {
            lines.push(heading(app, node, t));
        }
        let Some(snap) = &node.snap else { continue };
        if !snap.nvml.up {
            let why = snap.nvml.error.as_deref().unwrap_or("no poll yet");
            lines.push(Line::styled(format!("  NVML is down: {why}"), t.crit()));
        } else if snap.gpus.is_empty() {
            lines.push(Line::styled("  no GPUs", t.dim()));
        }
        for g in &snap.gpus {
            lines.push(compact(node, g, area.width, app.now, t));
        }
    }
    let visible = usize::from(area.height);
    let offset = app.overview_offset.min(lines.len().saturating_sub(visible));
    let more = lines.len().saturating_sub(offset + visible);
    let shown: Vec<Line> = lines.into_iter().skip(offset).take(visible).collect();
    f.render_widget(Paragraph::new(shown), area);
    if more > 0 {
        let msg = format!(" ↓ {more} more (j/k to scroll) ");
        let w = msg.chars().count() as u16;
        let r = Rect::new(
            area.right().saturating_sub(w),
            area.bottom() - 1,
            w.min(area.width),
            1,
        );
        f.render_widget(Paragraph::new(Line::styled(msg, t.tab_active())), r);
    }
}

fn heading(app: &App, node: &Node, t: Theme) -> Line<'static> {
    let where_ = match &node.origin {
        Origin::Daemon { url } => authority(url).to_string(),
        Origin::InProcess { .. } => "in-process".into(),
    };
    let mut s = vec![Span::styled(format!("▸ {} ", node.name), t.bold())];
    if where_ != node.name {
        s.push(Span::styled(format!("({where_}) "), t.dim()));
    }
    match &node.link {
        Link::Up => {
            let snap = node.snap.as_ref();
            s.push(Span::styled("connected", t.ok()));
            if let Some(snap) = snap {
                s.push(Span::raw(format!(
                    " · {} · {}",
                    plural(snap.gpus.len() as u64, "GPU"),
                    plural(snap.processes.len() as u64, "process")
                )));
            }
        }
        Link::Connecting => s.push(Span::styled("connecting…", t.warn())),
        Link::Down {
            error,
            retry_in_s,
            since,
            ..
        } => s.push(Span::styled(
            format!(
                "{}, retrying in {retry_in_s}s: {error}",
                disconnected(app.now, *since)
            ),
            t.crit(),
        )),
    }
    if node.firing() > 0 {
        s.push(Span::raw(" · "));
        s.push(Span::styled(format!("{} firing", node.firing()), t.crit()));
    }
    Line::from(s)
}

fn compact(node: &Node, g: &GpuView, width: u16, now: Timestamp, t: Theme) -> Line<'static> {
    let r = &g.reading;
    // idx, name, memory, util, temp, power; gauge and sparkline share what is left.
    let fixed = 3 + 17 + 13 + 5 + 6 + 6;
    let rest = usize::from(width).saturating_sub(fixed + 4);
    let (gw, sw) = (rest / 2, rest - rest / 2);
    let name = r.identity.name.trim_start_matches("NVIDIA ");
    let mut s = vec![
        Span::styled(format!("{:>2} ", r.identity.index), t.bold()),
        Span::raw(format!("{:<16} ", clip(name, 16))),
    ];
    match (r.state, r.memory) {
        (GpuState::Ok, Some(m)) => {
            s.extend(gauge(m.used, m.reserved, m.total, gw as u16, t).spans);
            s.push(Span::raw(format!(
                " {:>12}",
                format!("{}/{}", short(m.used), short(m.total))
            )));
        }
        (GpuState::Ok, None) => s.push(Span::styled(
            format!("{:<w$}", "memory n/a", w = gw + 13),
            t.dim(),
        )),
        (_, _) => {
            let what = if r.state == GpuState::Lost {
                "LOST"
            } else {
                "ERROR"
            };
            let msg = format!("{what}: {}", r.error.as_deref().unwrap_or(""));
            s.push(Span::styled(clip(&msg, gw + 13 + 18), t.crit()));
            return Line::from(s);
        }
    }
    s.push(Span::raw(format!(
        " {:>4} {:>5} {:>5} ",
        r.utilization
            .map(|u| format!("{:.0}%", u * 100.0))
            .unwrap_or_else(|| "n/a".into()),
        r.temperature_celsius
            .map(|c| format!("{c:.0}°C"))
            .unwrap_or_else(|| "n/a".into()),
        r.power_watts
            .map(|w| format!("{w:.0}W"))
            .unwrap_or_else(|| "n/a".into()),
    )));
    if let Some(h) = node.history.get(&r.identity.uuid) {
        let total = r.memory.map(|m| m.total).unwrap_or(0);
        let data = buckets(h.iter().copied(), now, sw);
        if let Some((lo, hi)) = spark_range(&data, total) {
            let bars: String = data.iter().map(|v| bar(*v, lo, hi)).collect();
            s.push(Span::styled(format!("{bars:>sw$}"), t.used()));
        }
    }
    let firing = gpu_firing(node, g);
    if firing > 0 {
        s.push(Span::styled(format!(" ▲{firing}"), t.crit()));
    }
    Line::from(s)
}

/// Bytes without the space and with one letter: "21.0G", for tight columns.
fn short(b: u64) -> String {
    bytes(b)
        .replace(" GiB", "G")
        .replace(" MiB", "M")
        .replace(" KiB", "K")
        .replace(" TiB", "T")
}

fn bar(v: Option<u64>, lo: u64, hi: u64) -> char {
    const BARS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    match v {
        None => '·',
        Some(v) => {
            let x = v.saturating_sub(lo) as f64 / (hi - lo).max(1) as f64;
            BARS[(x * 8.0).round().clamp(1.0, 8.0) as usize]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_real_gaps_and_bridge_jitter() {
        // 10 buckets over 300 s: 30 s each. Points at 1 s for the last 100 s, one real gap.
        let now = 1000.0;
        let pts: Vec<(f64, Option<u64>)> = (0..100)
            .map(|i| {
                let ts = now - 99.0 + i as f64;
                (ts, if i == 50 { None } else { Some(i as u64) })
            })
            .collect();
        let b = buckets(pts.into_iter(), now, 10);
        assert_eq!(b.len(), 4, "only buckets since the first point: {b:?}");
        assert_eq!(b.last(), Some(&Some(99)));
        // Sparse points (one every 3 buckets) leave no false gaps.
        let pts = [
            (now - 250.0, Some(5)),
            (now - 100.0, Some(7)),
            (now, Some(9)),
        ];
        let b = buckets(pts.into_iter(), now, 30);
        assert!(b.iter().all(|v| v.is_some()), "{b:?}");
        // An explicit None is shown.
        let pts = [(now - 20.0, Some(5)), (now - 10.0, None), (now, Some(9))];
        let b = buckets(pts.into_iter(), now, 300);
        assert!(b.contains(&None), "{b:?}");
    }

    #[test]
    fn gauge_adds_up_to_its_width() {
        let t = Theme::new(false);
        for w in [1u16, 7, 40, 77] {
            let l = gauge(21 << 30, 541 << 20, 80 << 30, w, t);
            assert_eq!(l.width(), usize::from(w));
        }
    }
}
