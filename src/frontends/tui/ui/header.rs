//! The two header lines (where the data comes from and how healthy it is), the tab bar and the
//! footer with the keys that work here.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::fmt::{clip, duration, plural, thousands};
use super::layout;
use super::theme::Theme;
use crate::core::snapshot::IngestView;
use crate::frontends::tui::app::state::{authority, App, Link, Node, Origin, Screen};

const SEP: &str = " │ ";

pub fn render(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let lines = if app.multi_node() {
        multi(app, t)
    } else if let Some(node) = app.nodes.first() {
        single(app, node, t)
    } else {
        vec![Line::from("gpumon: no data source")]
    };
    f.render_widget(Paragraph::new(lines), area);
}

fn single(app: &App, n: &Node, t: Theme) -> Vec<Line<'static>> {
    let mut l1 = vec![Span::styled("gpumon", t.accent())];
    let mut l2 = Vec::new();
    if let Some(s) = &n.snap {
        l1.push(Span::raw(SEP));
        l1.push(Span::styled(s.hostname.clone(), t.bold()));
    }
    l1.push(Span::raw(SEP));
    match &n.origin {
        Origin::Daemon { url } => {
            let version = n.snap.as_ref().map(|s| s.version.as_str()).unwrap_or("?");
            l1.push(Span::raw(format!("daemon {version} at {}", authority(url))));
        }
        Origin::InProcess { reason } => {
            l1.push(Span::styled("in-process NVML", t.warn()));
            l2.push(Span::styled(
                format!("ingest and findings unavailable ({reason})"),
                t.dim(),
            ));
        }
    }
    if n.link != Link::Up {
        l1.push(Span::raw(SEP));
        l1.extend(link(app, n, t));
    }
    if let Some(s) = &n.snap {
        l1.push(Span::raw(SEP));
        if s.nvml.up {
            l1.push(Span::styled("NVML up", t.ok()));
            if let Some(d) = &s.nvml.driver_version {
                l1.push(Span::raw(format!(" ({d})")));
            }
        } else {
            l1.push(Span::styled("NVML DOWN", t.crit()));
        }
    }
    if let (
        Link::Down {
            error,
            retry_in_s,
            attempt,
            ..
        },
        true,
    ) = (&n.link, l2.is_empty())
    {
        let msg = format!("retrying in {retry_in_s}s (attempt {attempt}): {error}");
        l2.push(Span::styled(clip(&msg, usize::from(app.width)), t.warn()));
    } else if matches!(n.origin, Origin::Daemon { .. }) {
        l2.extend(ingest(n.snap.as_ref().and_then(|s| s.ingest), t));
        l2.push(Span::raw(SEP));
        l2.extend(firing(app.firing(), t));
    }
    vec![Line::from(l1), Line::from(l2)]
}

fn multi(app: &App, t: Theme) -> Vec<Line<'static>> {
    let up = app.nodes.iter().filter(|n| n.link == Link::Up).count();
    let down = app
        .nodes
        .iter()
        .filter(|n| matches!(n.link, Link::Down { .. }))
        .count();
    let snaps: Vec<_> = app.nodes.iter().filter_map(|n| n.snap.as_ref()).collect();
    let nvml_up = snaps.iter().filter(|s| s.nvml.up).count();
    let mut l1 = vec![
        Span::styled("gpumon", t.accent()),
        Span::raw(format!(" {} nodes: {up} up", app.nodes.len())),
    ];
    if down > 0 {
        l1.push(Span::raw(", "));
        l1.push(Span::styled(
            format!("{down} disconnected, retrying"),
            t.crit(),
        ));
    }
    l1.push(Span::raw(SEP));
    let nvml_style = if nvml_up == snaps.len() {
        t.ok()
    } else {
        t.crit()
    };
    l1.push(Span::styled(
        format!("NVML up on {nvml_up} of {}", snaps.len()),
        nvml_style,
    ));
    let total = snaps
        .iter()
        .filter_map(|s| s.ingest)
        .fold(None, |acc: Option<IngestView>, i| {
            let a = acc.unwrap_or_default();
            Some(IngestView {
                connections: a.connections + i.connections,
                lines: a.lines + i.lines,
                rejected: a.rejected + i.rejected,
                dropped: a.dropped + i.dropped,
            })
        });
    let mut l2 = ingest(total, t);
    l2.push(Span::raw(SEP));
    l2.extend(firing(app.firing(), t));
    vec![Line::from(l1), Line::from(l2)]
}

fn link(app: &App, n: &Node, t: Theme) -> Vec<Span<'static>> {
    match &n.link {
        Link::Connecting => vec![Span::styled("connecting…", t.warn())],
        Link::Up => match &n.origin {
            Origin::Daemon { .. } => vec![Span::styled("connected", t.ok())],
            Origin::InProcess { .. } => vec![Span::styled("reading NVML", t.ok())],
        },
        Link::Down { since, .. } => {
            vec![Span::styled(disconnected(app.now, *since), t.crit())]
        }
    }
}

/// "DISCONNECTED for 41s", or just "DISCONNECTED" the moment it happens.
pub fn disconnected(now: f64, since: f64) -> String {
    if now - since >= 1.0 {
        format!("DISCONNECTED for {}", duration(now - since))
    } else {
        "DISCONNECTED".into()
    }
}

fn ingest(i: Option<IngestView>, t: Theme) -> Vec<Span<'static>> {
    let Some(i) = i else {
        return vec![Span::styled("ingest n/a", t.dim())];
    };
    let bad = |n: u64| if n > 0 { t.warn() } else { t.text() };
    vec![
        Span::raw(format!(
            "ingest {} · {} lines · ",
            plural(i.connections, "conn"),
            thousands(i.lines)
        )),
        Span::styled(format!("{} rejected", i.rejected), bad(i.rejected)),
        Span::raw(" · "),
        // Replies the daemon could not send (a trainer not reading), not lost trainer lines:
        // the help's second page says so.
        Span::styled(format!("{} unsent", i.dropped), bad(i.dropped)),
    ]
}

fn firing(n: usize, t: Theme) -> Vec<Span<'static>> {
    if n == 0 {
        vec![Span::styled("no findings firing", t.ok())]
    } else {
        vec![Span::styled(format!("{n} firing"), t.crit())]
    }
}

pub fn tabs(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let current = if app.detail.is_some() {
        Screen::Processes
    } else {
        app.screen
    };
    let mut spans = Vec::new();
    for (s, label, _) in layout::tabs(app) {
        let style = if s == current {
            t.tab_active()
        } else if s == Screen::Findings && app.firing() > 0 {
            t.crit()
        } else {
            t.text()
        };
        spans.push(Span::styled(label, style));
        spans.push(Span::raw(" "));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

pub fn footer(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let line = if app.procs.editing {
        Line::from(vec![
            Span::styled("filter: ", t.accent()),
            Span::raw(app.procs.filter.clone()),
            Span::styled("▏", t.accent()),
            Span::styled("  enter keep · esc clear", t.dim()),
        ])
    } else {
        let keys = match (&app.detail, app.screen) {
            (Some(_), _) => "esc back · z chart lines · tab screens · ? help · q quit",
            (None, Screen::Overview) => "tab/←→ screens · ↑↓ scroll · ? help · q quit",
            (None, Screen::Processes) => {
                "↑↓ select · enter detail · s/S sort · / filter · ? help · q quit"
            }
            (None, Screen::Findings) => "↑↓ select · enter open trainer · ? help · q quit",
        };
        Line::styled(keys, t.dim())
    };
    f.render_widget(Paragraph::new(line), area);
}
