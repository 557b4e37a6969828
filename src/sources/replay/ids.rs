//! The session id each run opens its session under: the one its daemon gave it, read off its
//! first trace's file name, so messages ("after rank 5's oom (s-…)") and `consequence_of` name
//! sessions offline as they did live. A run whose trace names none (a file renamed, a fixture,
//! a second session in one run) or whose id an earlier run already holds (two daemons that gave
//! one id, an older `s-<n>` each) is numbered `s-<n>` here, skipping every id a trace holds, so
//! ids stay unique in the core.

use std::collections::HashSet;

#[derive(Default)]
pub(super) struct Ids {
    /// By run: the id its trace holds, until its session opens.
    recorded: Vec<Option<String>>,
    /// Every id a trace holds: not given to a run numbered here.
    held: HashSet<String>,
    /// The last number given here.
    n: u64,
}

impl Ids {
    /// The ids runs' traces hold, by run; an id held by an earlier run is left to it.
    pub fn recorded(ids: Vec<Option<String>>) -> Self {
        let mut held = HashSet::new();
        let recorded = ids
            .into_iter()
            .map(|id| id.filter(|id| held.insert(id.clone())))
            .collect();
        Self {
            recorded,
            held,
            n: 0,
        }
    }

    /// The id for the session run `run` opens now: its trace's, once, else the next free number.
    pub fn take(&mut self, run: usize) -> String {
        if let Some(id) = self.recorded.get_mut(run).and_then(Option::take) {
            return id;
        }
        loop {
            self.n += 1;
            let id = format!("s-{}", self.n);
            if !self.held.contains(&id) {
                return id;
            }
        }
    }
}

#[cfg(test)]
mod tests;
