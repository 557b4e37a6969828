//! Rows of processes without a trainer, kept from the last refresh while what they are made of
//! (the process as NVML and /proc see it, the node's name, its badges) is unchanged.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::{Badge, ProcRow};
use crate::core::snapshot::ProcessView;

/// The last refresh's reusable rows, by (node, GPU, pid).
pub struct Old(HashMap<(usize, u32, u32), ProcRow>);

impl Old {
    pub fn new(rows: Vec<ProcRow>) -> Self {
        Self(
            rows.into_iter()
                .filter(|r| r.inputs != 0)
                .filter_map(|r| Some(((r.key.node, r.key.gpu?, r.key.pid), r)))
                .collect(),
        )
    }

    /// The row of `p` on node `n`, when it was made from the same `inputs` (0: never).
    pub fn take(&mut self, n: usize, p: &ProcessView, inputs: u64) -> Option<ProcRow> {
        if inputs == 0 {
            return None;
        }
        let row = self.0.remove(&(n, p.gpu, p.pid))?;
        (row.inputs == inputs).then_some(row)
    }
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
