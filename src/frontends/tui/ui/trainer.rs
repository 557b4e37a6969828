//! Trainer detail: allocated floor, peak and reserved over steps, the leak slope when detection
//! has one, the OOM forecast, where the memory went at a step peak (categories.rs), the
//! finding's message and hint, where the leak's memory is allocated (sites.rs) and recent
//! events. A GPU process without the client gets process.rs.

use ratatui::layout::Rect;
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph, Wrap};
use ratatui::Frame;

use super::categories;
use super::fmt::{ago, duration, thousands};
use super::ledger;
use super::oom;
use super::sites::{self, Room};
use super::theme::Theme;
use super::{notice, process};
use crate::core::snapshot::SessionView;
use crate::core::trainer::SessionPoint;
use crate::frontends::tui::app::rows::{latest_floor, RowKey};
use crate::frontends::tui::app::state::{App, Node};
use crate::frontends::tui::finding::{Finding, FindingView, State};
use crate::units::bytes;

pub fn render(f: &mut Frame, area: Rect, app: &App, key: &RowKey, t: Theme) {
    let Some(node) = app.nodes.get(key.node) else {
        return;
    };
    let session = node.snap.as_ref().and_then(|s| {
        let id = key.session.as_ref()?;
        s.sessions.iter().find(|x| &x.session == id)
    });
    match session {
        Some(s) => trainer(f, area, app, node, s, t),
        None => process::render(f, area, app, node, key, t),
    }
}

fn trainer(f: &mut Frame, area: Rect, app: &App, node: &Node, s: &SessionView, t: Theme) {
    let mut title = vec![Span::styled(
        format!(
            " {}{} · pid {}{} · GPU {} · {} ",
            s.job.as_deref().unwrap_or("trainer"),
            s.rank.map(|r| format!(" rank {r}")).unwrap_or_default(),
            s.pid,
            s.ns_pid
                .filter(|n| *n != u64::from(s.pid))
                .map(|n| format!(" (ns {n})"))
                .unwrap_or_default(),
            s.gpu.map(|g| g.to_string()).unwrap_or_else(|| "?".into()),
            s.session,
        ),
        t.bold(),
    )];
    if app.multi_node() {
        title.push(Span::styled(format!("on {} ", node.name), t.dim()));
    }
    let status = match (&s.ended, s.step) {
        (Some((ts, e)), _) => Span::styled(
            format!(" ended {} ({:?}) ", ago(app.now, *ts), e).to_lowercase(),
            t.warn(),
        ),
        (None, Some(step)) => Span::styled(
            format!(
                " step {} · {} ",
                thousands(step),
                s.phase.as_deref().unwrap_or("train")
            ),
            t.accent(),
        ),
        (None, None) => Span::styled(" no sample yet ", t.dim()),
    };
    let block = Block::bordered()
        .border_style(t.border())
        .title(Line::from(title))
        .title(Line::from(status).right_aligned());
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.height < 4 {
        return;
    }

    let findings = node.findings_for(&s.session, s.pid);
    let wide = inner.width >= 120;
    let text_w = if wide { inner.width / 2 } else { inner.width };
    let finding_lines = finding_text(&findings, app, t);
    let need_f = wrapped_height(&finding_lines, text_w);
    let events = event_lines(s, app, t, if wide { 8 } else { 2 });
    // The leak finding's sites; else what was live at the near_limit's step peak; else that the
    // trainer is being asked; else the session's latest answer, which may say why no sites came. An explained OOM listed before the leak's
    // finding (newer, or the leak's is over) takes their place: it names the same memory, at
    // the moment it ran out.
    let leak_at = findings
        .iter()
        .position(|f| f.kind == crate::core::detect::Kind::Leak && f.attribution.is_some());
    let explained = findings
        .iter()
        .enumerate()
        .find_map(|(i, f)| f.explanation().map(|e| (i, e)))
        .filter(|(i, _)| leak_at.is_none_or(|l| *i < l))
        .map(|(_, e)| e);
    let on_finding = findings
        .iter()
        .filter(|f| f.kind == crate::core::detect::Kind::Leak)
        .find_map(|f| f.attribution.as_ref());
    let asking = on_finding
        .is_none()
        .then(|| sites::asking(&s.events, app.now, t))
        .flatten();
    let attribution = on_finding.or(s.attribution.as_ref().filter(|_| asking.is_none()));
    let room = if wide {
        Room {
            sites: 5,
            callers: 2,
            width: inner.width - text_w - 1,
        }
    } else {
        Room {
            sites: 3,
            callers: 0,
            width: inner.width,
        }
    };
    // Pressure's question, once an armed trainer answered it: what was live at the step peak.
    let peak = findings
        .iter()
        .filter(|f| f.kind == crate::core::detect::Kind::NearLimit)
        .find_map(|f| f.peak.as_ref());
    let site_lines = if let Some(e) = explained {
        oom::lines(e, room, t)
    } else if let Some(a) = on_finding {
        sites::lines(a, room, t)
    } else if let Some(p) = peak {
        sites::peak(p, room, t)
    } else if let Some(line) = asking {
        vec![line]
    } else if let Some(a) = attribution {
        sites::lines(a, room, t)
    } else {
        Vec::new()
    };
    let most = inner.height.saturating_sub(7);

    if wide {
        // Sites and events share the right column, beside the finding; sites with callers and
        // notes take more rows, from the chart.
        let cap = if site_lines.is_empty() { 10 } else { 20 };
        let mut right = site_lines;
        if !right.is_empty() {
            right.push(Line::from(""));
        }
        right.extend(events);
        let bottom = need_f.max(right.len() as u16).clamp(4, cap).min(most);
        let below = top_parts(f, inner, app, s, &findings, bottom, t);
        let left = Rect {
            width: text_w,
            ..below
        };
        let right_area = Rect {
            x: below.x + text_w + 1,
            width: below.width - text_w - 1,
            ..below
        };
        f.render_widget(
            Paragraph::new(finding_lines).wrap(Wrap { trim: false }),
            left,
        );
        f.render_widget(Paragraph::new(right), right_area);
        return;
    }
    // Stacked: the finding first, then its sites, then events if two lines of them still fit.
    // The first finding is shown whole up to 8 lines (a message that names the top site is a
    // line longer), a second one only in what is left of 6.
    let first = finding_text(&findings[..findings.len().min(1)], app, t);
    let fh = need_f.min(wrapped_height(&first, text_w).clamp(6, 8));
    let sh = (site_lines.len() as u16).min(4);
    let mut eh = (events.len() as u16).min(most.saturating_sub(fh + sh));
    if eh < 2 {
        eh = 0;
    }
    let bottom = (fh + sh + eh).min(most);
    let below = top_parts(f, inner, app, s, &findings, bottom, t);
    let mut y = below.y;
    let mut part = |lines: Vec<Line<'static>>, h: u16, wrap: bool| {
        let h = h.min(below.bottom() - y);
        let p = Paragraph::new(lines);
        let p = if wrap {
            p.wrap(Wrap { trim: false })
        } else {
            p
        };
        f.render_widget(
            p,
            Rect {
                y,
                height: h,
                ..below
            },
        );
        y += h;
    };
    part(finding_lines, fh, true);
    part(site_lines, sh, false);
    part(events, eh, false);
}

/// The legend, the ledger and the memory split, and the chart, over the area's top, leaving
/// `bottom` rows below, which it returns.
fn top_parts(
    f: &mut Frame,
    inner: Rect,
    app: &App,
    s: &SessionView,
    findings: &[&Finding],
    bottom: u16,
    t: Theme,
) -> Rect {
    let active = |kind| {
        findings
            .iter()
            .copied()
            .find(|f| f.kind == kind && matches!(f.state(), State::Firing | State::Pending))
    };
    let leak = active(crate::core::detect::Kind::Leak);
    // Memory outside the allocator is growing: the ledger's bar shows that part in warning.
    let growing = active(crate::core::detect::Kind::UntrackedGrowth).is_some();
    let slope = leak.and_then(|f| f.evidence.slope_bytes_per_step);
    let zoom = app.zoomed();
    let mut lines = legend(s, slope, zoom, t).to_vec();
    // Where NVML's figure went, when the chart keeps at least 4 rows for itself.
    if let Some(l) = s.ledger.as_ref().filter(|_| inner.height >= bottom + 7) {
        lines.push(ledger::line(l, inner.width, growing, t));
    }
    // Where the memory went at a step peak, whole or not at all, when the chart still keeps 4.
    let split = categories::lines(s, inner.width, t);
    if !split.is_empty()
        && usize::from(inner.height) >= usize::from(bottom) + lines.len() + split.len() + 4
    {
        lines.extend(split);
    }
    let top = lines.len() as u16;
    f.render_widget(
        Paragraph::new(lines),
        Rect {
            height: top,
            ..inner
        },
    );
    let chart = Rect {
        y: inner.y + top,
        height: inner.height - top - bottom,
        ..inner
    };
    render_chart(f, chart, s, leak, zoom, t);
    Rect {
        y: chart.bottom(),
        height: bottom,
        ..inner
    }
}

/// Glyphs of the chart's lines: colour tells them apart, else the marker does.
fn glyphs(t: Theme) -> [(&'static str, Marker); 4] {
    if t.color() {
        [("━", Marker::Braille); 4]
    } else {
        [
            ("⣀", Marker::Braille),
            ("•", Marker::Dot),
            ("▄", Marker::Bar),
            ("⣀", Marker::Braille),
        ]
    }
}

/// The numbers now, doubling as the chart's legend: the lines' values, then the allocator's
/// health and the chart mode.
fn legend(s: &SessionView, slope: Option<f64>, zoom: bool, t: Theme) -> [Line<'static>; 2] {
    let st = s.stats.unwrap_or_default();
    let b = |v: Option<u64>| v.map(bytes).unwrap_or_else(|| "n/a".into());
    let [g_floor, g_peak, g_res, g_slope] = glyphs(t);
    let frag = match (st.allocated, st.reserved) {
        (Some(a), Some(r)) if r > 0 => {
            format!("{:.0}%", r.saturating_sub(a) as f64 * 100.0 / r as f64)
        }
        _ => "n/a".into(),
    };
    let warn = |n: u64| if n > 0 { t.warn() } else { t.text() };
    let mut spans = vec![
        Span::styled(format!("{} floor ", g_floor.0), t.used()),
        Span::raw(b(latest_floor(s))),
        Span::styled(format!("  {} peak ", g_peak.0), t.peak()),
        Span::raw(b(st.allocated_peak)),
        Span::styled(format!("  {} reserved ", g_res.0), t.reserved()),
        Span::raw(b(st.reserved)),
    ];
    if let Some(m) = slope {
        spans.push(Span::styled(format!("  {} leak ", g_slope.0), t.slope()));
        spans.push(Span::raw(format!("{}/step", signed_bytes(m))));
    }
    let mut more = vec![
        Span::styled("frag ", t.dim()),
        Span::raw(frag),
        Span::styled("  retries ", t.dim()),
        Span::styled(
            s.alloc_retries_total.to_string(),
            warn(s.alloc_retries_total),
        ),
        Span::styled("  OOMs ", t.dim()),
        Span::styled(s.ooms_total.to_string(), warn(s.ooms_total)),
    ];
    if let (Some(free), Some(total)) = (s.device_free, s.device_total) {
        more.push(Span::styled("  device free ", t.dim()));
        more.push(Span::raw(format!("{} of {}", bytes(free), bytes(total))));
    }
    // set_per_process_memory_fraction: the allocator's real limit, whatever the device has free.
    if let Some(cap) = s.alloc_limit {
        more.push(Span::styled("  cap ", t.dim()));
        more.push(Span::raw(crate::units::bytes_fine(cap)));
    }
    let mode = if zoom {
        "  · chart: floor only (z: all)"
    } else {
        "  · chart: all lines (z: floor only)"
    };
    more.push(Span::styled(mode, t.dim()));
    [Line::from(spans), Line::from(more)]
}

fn render_chart(
    f: &mut Frame,
    area: Rect,
    s: &SessionView,
    leak: Option<&Finding>,
    zoom: bool,
    t: Theme,
) {
    let pts: Vec<(f64, SessionPoint)> = crate::frontends::tui::app::merge::window(s)
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            p.value
                .map(|v| (v.step.map(|x| x as f64).unwrap_or(i as f64), v))
        })
        .collect();
    if pts.is_empty() {
        return notice(
            f,
            area,
            vec![Line::styled(
                "No samples yet: the chart starts at the first step.",
                t.dim(),
            )],
        );
    }
    let series = |get: fn(&SessionPoint) -> Option<u64>, train_only: bool| {
        pts.iter()
            .filter(|(_, v)| !train_only || v.train)
            .filter_map(|(x, v)| get(v).map(|y| (*x, y as f64)))
            .collect::<Vec<(f64, f64)>>()
    };
    let floor = series(|v| v.allocated, true);
    let (peak, reserved) = if zoom {
        (Vec::new(), Vec::new())
    } else {
        (
            series(|v| v.allocated_peak, false),
            series(|v| v.reserved, false),
        )
    };
    let x0 = pts.first().map(|p| p.0).unwrap_or(0.0);
    let x1 = pts.last().map(|p| p.0).unwrap_or(1.0).max(x0 + 1.0);
    // The leak's fitted line, through the latest floor, from where detection says it began.
    let slope = leak
        .and_then(|f| {
            let m = f.evidence.slope_bytes_per_step?;
            let &(xl, yl) = floor.last()?;
            let xa = f.first_step.map(|s| s as f64).unwrap_or(x0).clamp(x0, xl);
            Some(vec![(xa, yl - m * (xl - xa)), (xl, yl)])
        })
        .unwrap_or_default();
    let ys = || {
        floor
            .iter()
            .chain(&peak)
            .chain(&reserved)
            .chain(&slope)
            .map(|p| p.1)
    };
    let (lo, hi) = (ys().fold(f64::MAX, f64::min), ys().fold(0.0, f64::max));
    // Never zoom in below 64 MiB of range: flat lines stay flat instead of magnified noise.
    let pad = ((hi - lo) * 0.1).max(32.0 * 1024.0 * 1024.0);
    let (lo, hi) = ((lo - pad).max(0.0), hi + pad);
    let [g_floor, g_peak, g_res, g_slope] = glyphs(t);
    let line = |name: &'static str, m: Marker, style, data| {
        Dataset::default()
            .name(name)
            .marker(m)
            .graph_type(GraphType::Line)
            .style(style)
            .data(data)
    };
    let mut sets = Vec::new();
    if !zoom {
        sets.push(line("reserved", g_res.1, t.reserved(), &reserved));
        sets.push(line("peak", g_peak.1, t.peak(), &peak));
    }
    sets.push(line("floor", g_floor.1, t.used(), &floor));
    if !slope.is_empty() {
        sets.push(line("leak", g_slope.1, t.slope(), &slope));
    }
    let chart = Chart::new(sets)
        .x_axis(
            Axis::default()
                .title(Span::styled("step", t.dim()))
                .bounds([x0, x1])
                .labels([thousands(x0 as u64), thousands(x1 as u64)])
                .style(t.dim()),
        )
        .y_axis(
            Axis::default()
                .bounds([lo, hi])
                .labels([
                    bytes(lo as u64),
                    bytes(((lo + hi) / 2.0) as u64),
                    bytes(hi as u64),
                ])
                .style(t.dim()),
        )
        .legend_position(None);
    f.render_widget(chart, area);
}

fn finding_text(findings: &[&Finding], app: &App, t: Theme) -> Vec<Line<'static>> {
    if findings.is_empty() {
        return vec![
            Line::styled("No finding for this trainer.", t.ok()),
            Line::styled(
                "Leaks, near-limit pressure, fragmentation and OOMs are flagged here with why and what to do.",
                t.dim(),
            ),
        ];
    }
    let mut out = Vec::new();
    for f in findings.iter().take(2) {
        let when = match f.state() {
            State::Resolved => f
                .resolved_ts
                .map(|ts| format!("resolved {}", ago(app.now, ts))),
            _ => f
                .since
                .or(Some(f.first_ts))
                .map(|ts| format!("{} since {}", f.state, ago(app.now, ts))),
        }
        .unwrap_or_else(|| f.state.to_string());
        let mut head = vec![
            Span::styled(format!("▲ {} ", f.label()), t.severity(f.critical())),
            Span::styled(format!("{} · {when}", f.severity), t.dim()),
        ];
        if f.survived() {
            head.push(Span::styled(" · survived: the run went on", t.ok()));
        }
        out.push(Line::from(head));
        if !f.message.is_empty() {
            out.push(Line::from(f.message.clone()));
        }
        // The slope is in the legend above the chart; the forecast and certainty go here.
        let e = &f.evidence;
        let mut facts = Vec::new();
        match (e.oom_eta_steps, e.oom_eta_seconds) {
            (Some(n), Some(s)) => facts.push(format!(
                "OOM forecast: in ~{} steps (~{})",
                thousands(n),
                duration(s)
            )),
            (Some(n), None) => facts.push(format!("OOM forecast: in ~{} steps", thousands(n))),
            (None, Some(s)) => facts.push(format!("OOM forecast: in ~{}", duration(s))),
            (None, None) => {}
        }
        if let Some(c) = e.confidence {
            facts.push(format!("confidence {:.1}%", c * 100.0));
        }
        if !facts.is_empty() {
            out.push(Line::styled(facts.join(" · "), t.warn()));
        }
        // An explained OOM's own remedy, beside its explanation, says what the generic hint would.
        let remedy = f.explanation().is_some_and(|x| !x.remedies.is_empty());
        if let Some(h) = f.hint.as_ref().filter(|_| !remedy) {
            out.push(Line::from(vec![
                Span::styled("hint: ", t.accent()),
                Span::raw(h.clone()),
            ]));
        }
    }
    out
}

fn signed_bytes(v: f64) -> String {
    let sign = if v < 0.0 { "-" } else { "+" };
    format!("{sign}{}", bytes(v.abs() as u64))
}

fn event_lines(s: &SessionView, app: &App, t: Theme, max: usize) -> Vec<Line<'static>> {
    let mut out = vec![Line::styled("Recent events", t.bold())];
    if s.events.is_empty() {
        out.push(Line::styled("none", t.dim()));
    }
    for e in s.events.iter().rev().take(max) {
        let mut parts = Vec::new();
        if let Some(a) = e.alloc_bytes {
            parts.push(format!("alloc {}", bytes(a)));
        }
        if let Some(fr) = e.device_free {
            parts.push(format!("free {}", bytes(fr)));
        }
        if let Some(d) = &e.detail {
            parts.push(d.clone());
        }
        let style = if matches!(e.kind.as_str(), "oom" | "crash") {
            t.crit()
        } else {
            t.text()
        };
        out.push(Line::from(vec![
            Span::styled(format!("{:>10} ", ago(app.now, e.ts)), t.dim()),
            // Padded, and apart from the detail however long the kind.
            Span::styled(format!("{:<10} ", e.kind), style),
            Span::raw(parts.join(" · ")),
        ]));
    }
    out
}

fn wrapped_height(lines: &[Line], width: u16) -> u16 {
    let w = usize::from(width).max(1);
    lines
        .iter()
        .map(|l| l.width().max(1).div_ceil(w) as u16)
        .sum()
}
