//! The TUI's whole state and the one place it changes: `App::update(Action)`. Input events and
//! data from the sources both arrive as actions; widgets only read `&App`.

use super::jobs::Jobs;
use super::lists::window;
use super::rows::{self, RowKey};
use crate::core::model::Timestamp;
use crate::frontends::tui::finding::{Finding, FindingView};
use crate::frontends::tui::geometry;
use crate::util::printable::{printable, printable_copy};

pub use super::action::{Action, Screen};

/// Pages of the help overlay (ui::help::PAGES): keys, then columns and words.
pub const HELP_PAGES: usize = 2;
pub use super::lists::{FindingList, ProcTable};
pub use super::node::{authority, Link, Node, Origin, Update, HISTORY_SECS};

#[derive(Debug, Clone)]
pub struct App {
    pub nodes: Vec<Node>,
    pub screen: Screen,
    /// The trainer (or process) whose detail is open, over the Processes screen.
    pub detail: Option<RowKey>,
    detail_from: Screen,
    pub help: bool,
    /// The help's page: keys, then columns and words.
    pub help_page: usize,
    /// Trainer chart on the floor alone; None: alone while a leak is active, else all lines.
    pub floor_zoom: Option<bool>,
    pub width: u16,
    pub height: u16,
    /// False under NO_COLOR.
    pub color: bool,
    pub procs: ProcTable,
    /// The trainers' jobs, one per run across every node.
    pub jobs: Jobs,
    pub findings: FindingList,
    pub overview_offset: usize,
    pub quit: bool,
    /// The newest time any source reported: "now" for relative times, so rendering is pure.
    pub now: Timestamp,
}

impl App {
    pub fn new(nodes: Vec<Node>, color: bool) -> Self {
        Self {
            nodes,
            screen: Screen::Overview,
            detail: None,
            detail_from: Screen::Processes,
            help: false,
            help_page: 0,
            floor_zoom: None,
            width: 80,
            height: 24,
            color,
            procs: ProcTable::default(),
            jobs: Jobs::default(),
            findings: FindingList::default(),
            overview_offset: 0,
            quit: false,
            now: 0.0,
        }
    }

    pub fn multi_node(&self) -> bool {
        self.nodes.len() > 1
    }

    pub fn firing(&self) -> usize {
        self.nodes.iter().map(Node::firing).sum()
    }

    /// Applies one action; returns whether the screen needs redrawing.
    pub fn update(&mut self, action: Action) -> bool {
        match action {
            Action::Data { node, update } => self.apply(node, update),
            Action::Resize { width, height } => {
                self.width = width;
                self.height = height;
                self.scroll_into_view();
            }
            Action::Quit => {
                self.quit = true;
                return false;
            }
            Action::ToggleHelp => {
                self.help = !self.help;
                self.help_page = 0;
            }
            Action::HelpPage => {
                // Past the last page the help closes, as any other key does.
                self.help_page += 1;
                if self.help_page >= HELP_PAGES {
                    self.help = false;
                    self.help_page = 0;
                }
            }
            Action::ToggleZoom => {
                if self.detail.is_none() {
                    return false;
                }
                self.floor_zoom = Some(!self.zoomed());
            }
            Action::NextScreen => self.show(self.screen.step(1)),
            Action::PrevScreen => self.show(self.screen.step(-1)),
            Action::Show(s) => self.show(s),
            Action::Up => self.move_by(-1),
            Action::Down => self.move_by(1),
            Action::PageUp => self.move_by(-(self.page() as isize)),
            Action::PageDown => self.move_by(self.page() as isize),
            Action::Top => self.move_by(isize::MIN / 2),
            Action::Bottom => self.move_by(isize::MAX / 2),
            Action::Select(n) => return self.select_visible(n),
            Action::Open => self.open(),
            Action::Back => {
                if self.help {
                    self.help = false;
                } else if self.detail.take().is_some() {
                    self.screen = self.detail_from;
                } else if !self.procs.filter.is_empty() && self.screen == Screen::Processes {
                    self.procs.filter.clear();
                    self.procs.refresh();
                } else {
                    return false;
                }
            }
            Action::SortNext => {
                self.procs.sort = Some(self.procs.sort_column().next());
                self.procs.desc = self.procs.sort_column().numeric();
                self.procs.refresh();
            }
            Action::SortReverse => {
                self.procs.desc = !self.procs.desc;
                self.procs.refresh();
            }
            Action::SortBy(c) => {
                if self.procs.sort_column() == c {
                    self.procs.desc = !self.procs.desc;
                } else {
                    self.procs.sort = Some(c);
                    self.procs.desc = c.numeric();
                }
                self.procs.refresh();
            }
            Action::FilterStart => {
                self.detail = None;
                self.screen = Screen::Processes;
                self.procs.editing = true;
            }
            Action::FilterInput(c) => {
                self.procs.filter.push(c);
                self.procs.refresh();
            }
            Action::FilterBackspace => {
                self.procs.filter.pop();
                self.procs.refresh();
            }
            Action::FilterApply => self.procs.editing = false,
            Action::FilterCancel => {
                self.procs.editing = false;
                self.procs.filter.clear();
                self.procs.refresh();
            }
        }
        self.scroll_into_view();
        true
    }

    /// Whether the open trainer's chart shows the floor alone.
    pub fn zoomed(&self) -> bool {
        self.floor_zoom.unwrap_or_else(|| {
            let Some(key) = &self.detail else {
                return false;
            };
            let (Some(node), Some(id)) = (self.nodes.get(key.node), &key.session) else {
                return false;
            };
            node.active_leak(id, key.pid).is_some()
        })
    }

    fn apply(&mut self, i: usize, update: Update) {
        let Some(node) = self.nodes.get_mut(i) else {
            return;
        };
        match update {
            Update::Snapshot(snap) => {
                // Read in this process: /proc's process names and NVML's errors, escaped here
                // as a daemon's answer is escaped where it is read (source.rs).
                let snap = printable_copy(&*snap).map_or(snap, Box::new);
                self.now = self.now.max(snap.ts);
                node.absorb(*snap);
            }
            Update::Answer {
                snap,
                sent,
                received,
            } => {
                self.now = self.now.max(snap.ts);
                node.clock.sample(snap.ts, sent, received);
                node.absorb(*snap);
            }
            Update::Down {
                error,
                ts,
                retry_in_s,
                attempt,
            } => {
                self.now = self.now.max(ts);
                let since = match &node.link {
                    Link::Down { since, .. } => *since,
                    _ => ts,
                };
                node.link = Link::Down {
                    error: printable(&error).into_owned(),
                    since,
                    retry_in_s,
                    attempt,
                };
            }
        }
        self.rebuild();
    }

    /// Recomputes everything derived from the nodes' data.
    pub fn rebuild(&mut self) {
        self.disambiguate_names();
        let old = std::mem::take(&mut self.procs.rows);
        self.procs.rows = rows::build_reusing(&self.nodes, old);
        self.procs.refresh();
        self.jobs = Jobs::build(&self.nodes);
        let mut items: Vec<(usize, Finding)> = self
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(n, node)| node.findings.iter().map(move |f| (n, f.clone())))
            .collect();
        items.sort_by(|(_, a), (_, b)| {
            (a.state(), b.sort_ts(), &a.id)
                .partial_cmp(&(b.state(), a.sort_ts(), &b.id))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let keep = self.findings.selected_id.clone();
        self.findings.items = items;
        if let Some(i) = keep.and_then(|(n, id)| {
            self.findings
                .items
                .iter()
                .position(|(m, f)| *m == n && f.id == id)
        }) {
            self.findings.selected = i;
        }
        self.findings.selected = self
            .findings
            .selected
            .min(self.findings.items.len().saturating_sub(1));
        self.remember_finding();
        self.scroll_into_view();
    }

    /// Two daemons on hosts with the same name are told apart by their URL.
    fn disambiguate_names(&mut self) {
        let names: Vec<String> = self
            .nodes
            .iter()
            .map(|n| match &n.snap {
                Some(s) => s.hostname.clone(),
                None => n.name.clone(),
            })
            .collect();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let dup = names.iter().filter(|n| **n == names[i]).count() > 1;
            node.name = match (&node.origin, dup) {
                (Origin::Daemon { url }, true) => authority(url).to_string(),
                _ => names[i].clone(),
            };
        }
    }

    fn show(&mut self, s: Screen) {
        self.detail = None;
        self.help = false;
        self.screen = s;
    }

    fn page(&self) -> usize {
        match self.screen {
            Screen::Findings => geometry::finding_rows(self.width, self.height),
            _ => geometry::table_rows(self.width, self.height),
        }
        .max(1)
    }

    fn move_by(&mut self, by: isize) {
        let shift = |cur: usize, len: usize| -> usize {
            let to = (cur as isize).saturating_add(by).max(0) as usize;
            to.min(len.saturating_sub(1))
        };
        if self.detail.is_some() {
            return;
        }
        match self.screen {
            Screen::Overview => {
                let gpus = self
                    .nodes
                    .iter()
                    .filter_map(|n| n.snap.as_ref())
                    .map(|s| s.gpus.len())
                    .sum();
                self.overview_offset = shift(self.overview_offset, gpus);
            }
            Screen::Processes => {
                self.procs.selected = shift(self.procs.selected, self.procs.view.len());
                self.procs.remember();
            }
            Screen::Findings => {
                self.findings.selected = shift(self.findings.selected, self.findings.items.len());
                self.remember_finding();
            }
        }
    }

    fn select_visible(&mut self, n: usize) -> bool {
        match self.screen {
            Screen::Processes if self.detail.is_none() => {
                let i = self.procs.offset + n;
                if i >= self.procs.view.len() {
                    return false;
                }
                if i == self.procs.selected {
                    self.open();
                } else {
                    self.procs.selected = i;
                    self.procs.remember();
                }
            }
            Screen::Findings => {
                let i = self.findings.offset + n;
                if i >= self.findings.items.len() {
                    return false;
                }
                self.findings.selected = i;
                self.remember_finding();
            }
            _ => return false,
        }
        self.scroll_into_view();
        true
    }

    fn open(&mut self) {
        match self.screen {
            Screen::Processes if self.detail.is_none() => {
                if let Some(r) = self.procs.selected_row() {
                    self.detail = Some(r.key.clone());
                    self.detail_from = Screen::Processes;
                    self.floor_zoom = None;
                }
            }
            Screen::Findings => {
                let Some((n, f)) = self.findings.selected_item() else {
                    return;
                };
                let row = self.procs.rows.iter().find(|r| {
                    r.key.node == *n && f.concerns(r.key.session.as_deref(), r.key.pid, r.key.gpu)
                });
                // A trainer that has ended has no row any more; its session still has a detail.
                let key = row.map(|r| r.key.clone()).or_else(|| {
                    Some(RowKey {
                        node: *n,
                        gpu: f.gpu_index(),
                        pid: f.subject.pid,
                        session: Some(f.subject.session.clone()).filter(|s| !s.is_empty()),
                    })
                });
                if let Some(key) = key {
                    self.detail = Some(key);
                    self.detail_from = Screen::Findings;
                    self.screen = Screen::Processes;
                    self.floor_zoom = None;
                }
            }
            _ => {}
        }
    }

    fn remember_finding(&mut self) {
        self.findings.selected_id = self
            .findings
            .selected_item()
            .map(|(n, f)| (*n, f.id.clone()));
    }

    /// Keeps the selection inside the visible window after anything moved or resized.
    fn scroll_into_view(&mut self) {
        let rows = geometry::table_rows(self.width, self.height).max(1);
        let p = &mut self.procs;
        p.offset = window(p.selected, p.offset, rows, p.view.len());
        let rows = geometry::finding_rows(self.width, self.height).max(1);
        let f = &mut self.findings;
        f.offset = window(f.selected, f.offset, rows, f.items.len());
    }
}
