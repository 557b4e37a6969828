//! The overview as one line per GPU, under a heading per node: for many GPUs or many nodes.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::fmt::{clip, pad, plural};
use super::gauge::gauge;
use super::header::disconnected;
use super::spark::{bar, buckets, short, spark_range};
use super::theme::Theme;
use crate::core::model::{GpuState, Timestamp};
use crate::core::snapshot::GpuView;
use crate::frontends::tui::app::state::{authority, App, Link, Node, Origin};

pub(super) fn listing(f: &mut Frame, area: Rect, app: &App, t: Theme) {
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

/// Lines `listing` draws when it has the room: a heading a node, a line a GPU (or why none).
pub(super) fn listed_lines(app: &App) -> usize {
    app.nodes
        .iter()
        .map(|n| {
            let gpus = n.snap.as_ref().map_or(0, |s| {
                usize::from(!s.nvml.up || s.gpus.is_empty()) + s.gpus.len()
            });
            usize::from(app.multi_node()) + gpus
        })
        .sum()
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
    let mut name = r.identity.name.trim_start_matches("NVIDIA ").to_string();
    if r.unified.is_some() {
        // Its memory is the host's: said where the row is, as the GPU's block says it.
        name.push_str(" unified");
    }
    let mut s = vec![
        Span::styled(format!("{:>2} ", r.identity.index), t.bold()),
        Span::raw(format!("{} ", pad(&clip(&name, 16), 16))),
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
    let firing = node.firing_on(g);
    if firing > 0 {
        s.push(Span::styled(format!(" ▲{firing}"), t.crit()));
    }
    Line::from(s)
}
