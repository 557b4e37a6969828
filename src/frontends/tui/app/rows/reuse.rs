//! Rows of processes without a trainer, kept from the last refresh while what they are made of
//! (the process as NVML and /proc see it, the node's name, its badges) is unchanged.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::{Badge, ProcRow};
use crate::core::snapshot::ProcessView;

/// The last refresh's rows, in the order they were built. Processes come in the same order
/// every refresh, so the rows just after the last one looked up are tried first; only a
/// process that came, or several that went, send a lookup to the index, built the first time
/// one is needed. (A map of all 1,000 rows built every refresh, and the rows moved into and
/// out of it, were a third of the TUI's CPU.)
pub struct Old {
    rows: Vec<ProcRow>,
    next: usize,
    index: Option<HashMap<(usize, u32, u32), usize>>,
}

impl Old {
    pub fn new(rows: Vec<ProcRow>) -> Self {
        Self {
            rows,
            next: 0,
            index: None,
        }
    }

    pub fn count(&self) -> usize {
        self.rows.len()
    }

    /// The row of `p` on node `n`, when it was made from the same `inputs` (0: never).
    pub fn take(&mut self, n: usize, p: &ProcessView, inputs: u64) -> Option<ProcRow> {
        if inputs == 0 {
            return None;
        }
        let key = (n, p.gpu, p.pid);
        // The next row, or the one after it: a trainer's row (never reused) or a process that
        // went sits between two plain processes' rows.
        let near =
            (self.next..self.next + 2).find(|&i| self.rows.get(i).and_then(row_key) == Some(key));
        let at = match near {
            Some(at) => at,
            None => *self.index().get(&key)?,
        };
        self.next = at + 1;
        let row = &mut self.rows[at];
        if row.inputs != inputs {
            return None;
        }
        // A taken slot keeps an empty row whose `inputs` is 0, so it is never taken twice.
        Some(std::mem::take(row))
    }

    fn index(&mut self) -> &HashMap<(usize, u32, u32), usize> {
        let rows = &self.rows;
        self.index.get_or_insert_with(|| {
            let mut m = HashMap::with_capacity(rows.len());
            for (i, r) in rows.iter().enumerate() {
                if let Some(k) = row_key(r) {
                    m.insert(k, i);
                }
            }
            m
        })
    }
}

/// (node, GPU, pid) of a row that can be reused: a process without a trainer.
fn row_key(r: &ProcRow) -> Option<(usize, u32, u32)> {
    (r.inputs != 0).then_some((r.key.node, r.key.gpu?, r.key.pid))
}

/// A hash of everything a trainer-less process row shows (never 0).
pub fn inputs(n: usize, node_name: &str, p: &ProcessView, badges: &[Badge]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    (n, node_name, p.gpu, p.pid, p.used_memory_bytes).hash(&mut h);
    (&p.info.user, &p.info.container, &p.info.name, badges).hash(&mut h);
    h.finish().max(1)
}

#[cfg(test)]
mod tests;
