//! The overview's trainer table, below the GPUs: which trainer has a problem and what it is.
//! The trainers of a job of several ranks sit together, in under the job's lines (its state,
//! its first failure and what followed, its memory across ranks: ui/job_lines.rs).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;
use std::cmp::Ordering;

use super::fmt::{self, clip, pad as pad_cells, plural};
use super::job_lines::lines as job_lines;
use super::theme::Theme;
use crate::core::jobs::JobState;
use crate::frontends::tui::app::jobs::Job;
use crate::frontends::tui::app::rows::{compare, Column, ProcRow};
use crate::frontends::tui::app::state::App;

/// Display order, left to right (the node only where several are shown).
const SHOWN: [Column; 10] = [
    Column::Name,
    Column::Node,
    Column::Gpu,
    Column::Pid,
    Column::Step,
    Column::Floor,
    Column::Peak,
    Column::Reserved,
    Column::Frag,
    Column::Findings,
];

/// After the name and the findings, which columns survive a narrow terminal, first to last.
const BY_PRIORITY: [Column; 7] = [
    Column::Gpu,
    Column::Floor,
    Column::Peak,
    Column::Reserved,
    Column::Step,
    Column::Frag,
    Column::Pid,
];

/// Names are cut no shorter than this ("PROCESS / JOB" and a little).
const NAME_MIN: usize = 16;

/// Lines the table needs inside its border (the column titles where a trainer is listed, job
/// lines and trainer rows), and how many of them are about a problem (a failed job's, a
/// trainer's with firing findings).
pub(super) fn live(app: &App) -> (usize, usize) {
    let t = Theme::new(false);
    let groups = groups(app);
    let titles = usize::from(groups.iter().any(|g| !g.rows.is_empty()));
    groups.iter().fold((titles, 0), |(n, f), g| {
        let head = g
            .job
            .map_or(0, |j| job_lines(j, usize::MAX, app.now, t).len());
        let firing = g.rows.iter().filter(|r| r.firing()).count();
        let hot = if g.failed() {
            head + g.rows.len()
        } else {
            firing + head * usize::from(firing > 0)
        };
        (n + head + g.rows.len(), f + hot)
    })
}

/// Trainers of one job under the job's lines, the others alone; failed jobs first, then by
/// the most severe findings. With no room for a table, one line says where they are listed.
pub(super) fn trainers(f: &mut Frame, area: Rect, app: &App, t: Theme) {
    let groups = groups(app);
    if groups.is_empty() || area.height == 0 {
        return;
    }
    if area.height < 4 {
        return hint(f, area, &groups, t);
    }
    let rows = || {
        groups
            .iter()
            .flat_map(|g| g.rows.iter().map(move |r| (g, *r)))
    };
    let indent = |g: &Group| if g.job.is_some() { INDENT } else { 0 };
    let name_need = rows()
        .map(|(g, r)| fmt::width(r.cell(Column::Name)) + indent(g))
        .max()
        .unwrap_or(0);
    let badges_need = rows().map(|(_, r)| badges_width(r)).max().unwrap_or(0);
    let room = usize::from(area.width.saturating_sub(2));
    let cols = columns(room, name_need, badges_need, app.multi_node());
    let header = Line::from(
        cols.iter()
            .enumerate()
            .flat_map(|(i, (c, w))| {
                let gap = Span::raw(if i == 0 { "" } else { " " });
                let title = format!("{:<w$}", pad(c.title(), *c, *w), w = *w);
                [gap, Span::styled(title, t.bold())]
            })
            .collect::<Vec<_>>(),
    );
    // Column titles over trainer rows only: a failed job's lines alone need none.
    let titles = u16::from(rows().next().is_some());
    let mut body: Vec<(Line, Item)> = Vec::new();
    for g in &groups {
        if let Some(j) = g.job {
            let lines = job_lines(j, room, app.now, t);
            body.extend(
                lines
                    .into_iter()
                    .enumerate()
                    .map(|(i, l)| (l, if i == 0 { Item::Job } else { Item::JobLine })),
            );
        }
        for r in &g.rows {
            body.push((row(r, &cols, indent(g), t), Item::Trainer));
        }
    }
    let visible = usize::from(area.height - 2 - titles);
    let area = Rect {
        height: area
            .height
            .min((body.len() as u16).saturating_add(2 + titles)),
        ..area
    };
    let trainers = groups.iter().map(|g| g.rows.len()).sum::<usize>();
    let jobs = groups.iter().filter(|g| g.job.is_some()).count();
    let mut title = vec![Span::styled(format!(" Trainers {trainers} "), t.bold())];
    if jobs > 0 {
        let failed = groups.iter().filter(|g| g.failed()).count();
        title.push(Span::styled(
            format!("· {} ", plural(jobs as u64, "job")),
            t.bold(),
        ));
        if failed > 0 {
            title.push(Span::styled(format!("({failed} failed) "), t.crit()));
        }
    }
    title.push(Span::styled("· enter on Processes for the chart ", t.dim()));
    let mut block = Block::bordered()
        .border_style(t.border())
        .title(Line::from(title));
    // Problems come first, so those cut off are the quiet ones; say where they are.
    let hidden = body.get(visible..).unwrap_or_default();
    if !hidden.is_empty() {
        let rows = hidden.iter().filter(|(_, i)| *i == Item::Trainer).count();
        let jobs = hidden.iter().filter(|(_, i)| *i == Item::Job).count();
        let more_jobs = format!("{jobs} more job{}", if jobs == 1 { "" } else { "s" });
        let msg = match (rows, jobs) {
            (_, 0) => format!(" {rows} more: 2 Processes lists them "),
            (0, _) => format!(" {more_jobs} "),
            _ => format!(" {rows} more trainers, {more_jobs}: 2 Processes lists the trainers "),
        };
        block = block.title_bottom(Line::styled(msg, t.dim()).right_aligned());
    }
    let mut lines = Vec::new();
    if titles > 0 {
        lines.push(header);
    }
    lines.extend(body.into_iter().take(visible).map(|(l, _)| l));
    f.render_widget(Paragraph::new(lines).block(block), area);
}

/// Cells a job's trainers are set in under its lines.
const INDENT: usize = 2;

/// What a line of the table is, to count what is cut off.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Item {
    Job,
    /// A job's line after its first.
    JobLine,
    Trainer,
}

/// A job with its live trainers, or a trainer of no job (or of a job of one rank, which its
/// row says all of).
struct Group<'a> {
    job: Option<&'a Job>,
    rows: Vec<&'a ProcRow>,
}

impl Group<'_> {
    fn failed(&self) -> bool {
        self.job.is_some_and(|j| j.view.state == JobState::Failed)
    }
}

fn groups(app: &App) -> Vec<Group<'_>> {
    let mut of_job: Vec<Vec<&ProcRow>> = vec![Vec::new(); app.jobs.list.len()];
    let mut out = Vec::new();
    for r in &app.procs.rows {
        let Some(session) = r.key.session.as_deref() else {
            continue;
        };
        match app.jobs.of(r.key.node, session) {
            Some(i) if headed(&app.jobs.list[i]) => of_job[i].push(r),
            _ => out.push(Group {
                job: None,
                rows: vec![r],
            }),
        }
    }
    for (job, mut rows) in app.jobs.list.iter().zip(of_job) {
        if rows.is_empty() && !(job.shown() && headed(job)) {
            continue;
        }
        rows.sort_by(|a, b| {
            weight(b)
                .cmp(&weight(a))
                .then_with(|| a.rank.cmp(&b.rank))
                .then_with(|| compare(a, b, Column::Findings, true))
        });
        out.push(Group {
            job: Some(job),
            rows,
        });
    }
    out.sort_by(|a, b| {
        b.failed()
            .cmp(&a.failed())
            .then_with(|| match (a.rows.first(), b.rows.first()) {
                (Some(x), Some(y)) => compare(x, y, Column::Findings, true),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            })
    });
    out
}

/// Whether a job gets lines of its own: one of several ranks, or one that failed or does not
/// add up. A lone trainer's row is its job.
fn headed(j: &Job) -> bool {
    let v = &j.view;
    v.members.len() > 1
        || v.world_size.is_some_and(|n| n > 1)
        || v.state == JobState::Failed
        || !v.conflicts.is_empty()
}

/// Critical findings weigh more than any number of warnings.
fn weight(r: &ProcRow) -> u32 {
    r.badges
        .iter()
        .map(|b| if b.critical { 100 } else { 1 })
        .sum()
}

/// One trainer's cells, `indent` cells in under its job.
fn row(r: &ProcRow, cols: &[(Column, usize)], indent: usize, t: Theme) -> Line<'static> {
    let mut spans = Vec::new();
    for (i, (c, w)) in cols.iter().enumerate() {
        if i > 0 {
            spans.push(Span::raw(" "));
        }
        match c {
            Column::Findings => {
                let mut left = *w;
                for (j, b) in r.badges.iter().enumerate() {
                    let need = b.kind.len() + usize::from(j > 0);
                    if need > left {
                        break;
                    }
                    if j > 0 {
                        spans.push(Span::raw(" "));
                    }
                    spans.push(Span::styled(b.kind, t.severity(b.critical)));
                    left -= need;
                }
                spans.push(Span::raw(" ".repeat(left)));
            }
            Column::Name => {
                let w = w.saturating_sub(indent);
                let name = pad_cells(&clip(r.cell(*c), w), w);
                spans.push(Span::raw(format!("{:indent$}{name}", "")));
            }
            _ => spans.push(Span::raw(format!("{:<w$}", pad(r.cell(*c), *c, *w)))),
        }
    }
    Line::from(spans)
}

/// One line in place of the table: how many trainers, how many with findings, failed jobs,
/// which key.
fn hint(f: &mut Frame, area: Rect, groups: &[Group], t: Theme) {
    let rows = groups.iter().flat_map(|g| &g.rows);
    let (n, firing) = rows.fold((0, 0), |(n, f), r| (n + 1, f + usize::from(r.firing())));
    let failed = groups.iter().filter(|g| g.failed()).count();
    let mut line = vec![
        Span::styled(format!(" {}", plural(n as u64, "trainer")), t.bold()),
        Span::styled(
            format!(" ({firing} with findings)"),
            if firing > 0 { t.crit() } else { t.dim() },
        ),
    ];
    if failed > 0 {
        line.push(Span::styled(
            format!(", {} failed", plural(failed as u64, "job")),
            t.crit(),
        ));
    }
    line.push(Span::styled(": 2 Processes lists them", t.dim()));
    f.render_widget(
        Paragraph::new(Line::from(line)),
        Rect {
            y: area.bottom() - 1,
            height: 1,
            ..area
        },
    );
}

/// Cells the row's badges take, one space between them.
fn badges_width(r: &ProcRow) -> usize {
    let n: usize = r.badges.iter().map(|b| b.kind.chars().count() + 1).sum();
    n.saturating_sub(1)
}

fn width(c: Column) -> usize {
    match c {
        Column::Gpu => 4,
        Column::Pid => 12,
        Column::Step => 8,
        Column::Frag => 5,
        _ => 10,
    }
}

/// Columns for `room` cells: the name and the findings first (which trainer, what is wrong),
/// then others while they fit. What is left goes to a name still cut, then to the findings,
/// so no column stands blank beside a cut name.
/// With several nodes, the node comes first of the others.
fn columns(room: usize, name_need: usize, badges_need: usize, multi: bool) -> Vec<(Column, usize)> {
    let findings = badges_need.max(Column::Findings.title().len());
    let name = name_need.clamp(NAME_MIN, (room / 2).max(NAME_MIN));
    let mut left = room.saturating_sub(name + 1 + findings);
    let mut keep = Vec::new();
    for c in multi.then_some(Column::Node).into_iter().chain(BY_PRIORITY) {
        if width(c) < left {
            left -= width(c) + 1;
            keep.push(c);
        }
    }
    let to_name = name_need.saturating_sub(name).min(left);
    SHOWN
        .iter()
        .filter_map(|c| match c {
            Column::Name => Some((*c, name + to_name)),
            Column::Findings => Some((*c, findings + left - to_name)),
            c if keep.contains(c) => Some((*c, width(*c))),
            _ => None,
        })
        .collect()
}

fn pad(s: &str, c: Column, w: usize) -> String {
    let s = clip(s, w);
    if c.numeric() {
        format!("{s:>w$}")
    } else {
        s
    }
}

#[cfg(test)]
mod tests;
