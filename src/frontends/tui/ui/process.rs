//! A GPU process without the client, opened from the process list: what NVML and /proc know
//! about it, and how to instrument it.

use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;

use super::notice;
use super::theme::Theme;
use crate::frontends::tui::app::rows::RowKey;
use crate::frontends::tui::app::state::{App, Node};
use crate::units::bytes;

pub fn render(f: &mut Frame, area: Rect, app: &App, node: &Node, key: &RowKey, t: Theme) {
    let block = Block::bordered()
        .border_style(t.border())
        .title(Line::styled(
            format!(
                " pid {} · GPU {} ",
                key.pid,
                key.gpu.map(|g| g.to_string()).unwrap_or_else(|| "?".into())
            ),
            t.bold(),
        ));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let p = node.snap.as_ref().and_then(|s| {
        s.processes
            .iter()
            .find(|p| p.pid == key.pid && Some(p.gpu) == key.gpu)
    });
    let Some(p) = p else {
        return notice(
            f,
            inner,
            vec![Line::styled("This process has ended.", t.dim())],
        );
    };
    let na = |v: &Option<String>| v.clone().unwrap_or_else(|| "n/a".into());
    let mut lines = vec![
        Line::from(format!("process   {}", na(&p.info.name))),
        Line::from(format!("user      {}", na(&p.info.user))),
        Line::from(format!(
            "container {}",
            p.info.container.clone().unwrap_or_else(|| "-".into())
        )),
        Line::from(format!("cgroup    {}", na(&p.info.cgroup))),
        Line::from(format!("kind      {}", p.kind.as_str())),
        Line::from(format!(
            "NVML used {}",
            p.used_memory_bytes
                .map(bytes)
                .unwrap_or_else(|| "n/a".into())
        )),
    ];
    if let Some(m) = &p.mig_uuid {
        lines.push(Line::from(format!("MIG       {m}")));
    }
    if app.multi_node() {
        lines.push(Line::from(format!("node      {}", node.name)));
    }
    lines.push(Line::from(""));
    lines.push(Line::styled(
        "Not instrumented: add gpumon_client.attach() to the training script, or run it as \
         `python -m gpumon_client run train.py`, to see its allocated floor, peak, reserved \
         memory and leak detection here.",
        t.dim(),
    ));
    f.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}
