//! The two lists a selection moves in: the Processes table (filtered, sorted, its selection
//! following its row across refreshes) and the Findings list.

use super::rows::{self, Column, ProcRow, RowKey};
use crate::frontends::tui::finding::Finding;

#[derive(Debug, Clone, Default)]
pub struct ProcTable {
    pub rows: Vec<ProcRow>,
    /// Indices into `rows` after filtering and sorting.
    pub view: Vec<usize>,
    pub sort: Option<Column>,
    pub desc: bool,
    pub filter: String,
    pub editing: bool,
    pub selected: usize,
    pub offset: usize,
    pub(super) selected_key: Option<RowKey>,
}

impl ProcTable {
    pub fn selected_row(&self) -> Option<&ProcRow> {
        self.view.get(self.selected).and_then(|i| self.rows.get(*i))
    }

    pub fn sort_column(&self) -> Column {
        self.sort.unwrap_or(Column::Gpu)
    }

    pub(super) fn refresh(&mut self) {
        let needle = self.filter.to_lowercase();
        let mut view: Vec<usize> = (0..self.rows.len())
            .filter(|i| self.rows[*i].matches(&needle))
            .collect();
        let (col, desc) = (self.sort_column(), self.desc);
        view.sort_by(|a, b| rows::compare(&self.rows[*a], &self.rows[*b], col, desc));
        self.view = view;
        let found = self
            .selected_key
            .as_ref()
            .and_then(|k| self.view.iter().position(|i| &self.rows[*i].key == k));
        self.selected = found
            .unwrap_or(self.selected)
            .min(self.view.len().saturating_sub(1));
        self.remember();
    }

    pub(super) fn remember(&mut self) {
        self.selected_key = self.selected_row().map(|r| r.key.clone());
    }
}

#[derive(Debug, Clone, Default)]
pub struct FindingList {
    /// (node index, finding): firing, then pending, then resolved; newest first in each.
    pub items: Vec<(usize, Finding)>,
    pub selected: usize,
    pub offset: usize,
    pub(super) selected_id: Option<(usize, String)>,
}

impl FindingList {
    pub fn selected_item(&self) -> Option<&(usize, Finding)> {
        self.items.get(self.selected)
    }
}

/// The first row of a window of `rows` that keeps `selected` in sight, moving as little as
/// possible from `offset`.
pub(super) fn window(selected: usize, offset: usize, rows: usize, len: usize) -> usize {
    let offset = if selected < offset {
        selected
    } else if selected >= offset + rows {
        selected + 1 - rows
    } else {
        offset
    };
    offset.min(len.saturating_sub(rows))
}
