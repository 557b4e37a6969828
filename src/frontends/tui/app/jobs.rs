//! Jobs as the TUI shows them: each daemon's `jobs`, one per (`job`, `run_id`, uid) across
//! every daemon it is connected to. A run seen by several daemons is judged again as one by
//! `jobs::merge` (the earliest failure on any node is the cause), with the hosts whose clock is
//! measured off by more than the tolerance named, so that it says "order unknown" instead of
//! guessing; a job only one daemon sees stays as that daemon judged it (with its own cascade
//! window, which the TUI cannot know).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::node::Node;
use crate::core::jobs::verdict::CLOCK_TOLERANCE_SECONDS;
use crate::core::jobs::{self, FirstFailure, JobState, JobView, Rules, RunKey};
use crate::frontends::tui::finding::{FindingView, State};

/// One job and what the overview decides by.
#[derive(Debug, Clone)]
pub struct Job {
    pub view: JobView,
    /// Members still running.
    pub live: usize,
    /// A finding about one of its members is firing or pending (a failed job's cause stays
    /// firing for the daemon's `detect.crash_hold`).
    pub active: bool,
}

impl Job {
    /// Listed on the Overview: while a rank runs, and after a failure while its findings last.
    pub fn shown(&self) -> bool {
        self.live > 0 || (self.view.state == JobState::Failed && self.active)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Jobs {
    /// Failed first, then running, then ended; by name within each.
    pub list: Vec<Job>,
    /// (node, session) to its job in `list`.
    of: HashMap<(usize, String), usize>,
    /// Hosts whose clock was measured off by more than the tolerance.
    pub skewed: Vec<String>,
}

impl Jobs {
    pub fn build(nodes: &[Node]) -> Self {
        let skewed: Vec<String> = nodes
            .iter()
            .filter_map(|n| {
                let snap = n.snap.as_ref()?;
                let off = n.clock.offset()?;
                (off.abs() > CLOCK_TOLERANCE_SECONDS).then(|| snap.hostname.clone())
            })
            .collect();
        // Each daemon's views, grouped by run; a job without a run id is its daemon's alone.
        let mut runs: BTreeMap<RunKey, Vec<(usize, JobView)>> = BTreeMap::new();
        let mut groups: Vec<Vec<(usize, JobView)>> = Vec::new();
        for (n, node) in nodes.iter().enumerate() {
            let Some(snap) = &node.snap else { continue };
            for v in &snap.jobs {
                let v = with_host(v.clone(), &snap.hostname);
                match v.identity().across_daemons() {
                    Some(key) => runs.entry(key).or_default().push((n, v)),
                    None => groups.push(vec![(n, v)]),
                }
            }
        }
        for g in runs.into_values() {
            let mut from: Vec<usize> = g.iter().map(|(n, _)| *n).collect();
            from.dedup();
            if from.len() > 1 {
                groups.push(g);
            } else {
                // One daemon's jobs of one run id (two users' jobs of one name are two jobs
                // there) stay as it judged them.
                groups.extend(g.into_iter().map(|v| vec![v]));
            }
        }
        let mut out = Jobs {
            skewed,
            ..Jobs::default()
        };
        // Sessions with a finding firing or pending, each node's.
        let active: Vec<HashSet<&str>> = nodes
            .iter()
            .map(|n| {
                n.findings
                    .iter()
                    .filter(|f| matches!(f.state(), State::Firing | State::Pending))
                    .map(|f| f.subject.session.as_str())
                    .collect()
            })
            .collect();
        let mut list: Vec<(Job, Vec<(usize, String)>)> = groups
            .into_iter()
            .filter_map(|g| out.judge(g, &active))
            .collect();
        list.sort_by(|(a, _), (b, _)| {
            let order = |j: &Job| match j.view.state {
                JobState::Failed => 0,
                JobState::Running => 1,
                JobState::Stopped | JobState::Ended => 2,
                JobState::Unknown => 3,
            };
            let key = |j: &Job| {
                (
                    order(j),
                    j.view.job.clone(),
                    j.view.run_id.clone(),
                    j.view.uid,
                )
            };
            key(a).cmp(&key(b))
        });
        for (i, (job, sessions)) in list.into_iter().enumerate() {
            out.of.extend(sessions.into_iter().map(|k| (k, i)));
            out.list.push(job);
        }
        out
    }

    /// One job from one daemon's view, or from several daemons' views of one run, merged.
    fn judge(
        &self,
        group: Vec<(usize, JobView)>,
        active: &[HashSet<&str>],
    ) -> Option<(Job, Vec<(usize, String)>)> {
        let sessions: Vec<(usize, String)> = group
            .iter()
            .flat_map(|(n, v)| v.sessions.iter().map(move |s| (*n, s.clone())))
            .collect();
        let mut views: Vec<JobView> = group.into_iter().map(|(_, v)| v).collect();
        // Two connections to one daemon (its sessions on its host again) would count its
        // ranks twice.
        let mut seen = HashSet::new();
        views.retain(|v| seen.insert((v.hosts.clone(), v.sessions.clone())));
        let view = if views.len() > 1 {
            jobs::merge(views, &self.skewed, &Rules::default())
                .into_iter()
                .next()?
        } else {
            views.pop()?
        };
        let live = view.members.iter().filter(|m| m.ended.is_none()).count();
        let active = sessions
            .iter()
            .any(|(n, s)| active.get(*n).is_some_and(|a| a.contains(s.as_str())));
        Some((Job { view, live, active }, sessions))
    }

    /// The job the trainer `session` of node `node` is a rank of.
    pub fn of(&self, node: usize, session: &str) -> Option<usize> {
        self.of.get(&(node, session.to_string())).copied()
    }
}

/// A daemon's view with every member, and every failure named in it, on `host` where the
/// daemon did not say (one that names no host is on its own).
fn with_host(mut v: JobView, host: &str) -> JobView {
    let fill = |h: &mut Option<String>| {
        if h.is_none() {
            *h = Some(host.to_string());
        }
    };
    for m in &mut v.members {
        fill(&mut m.host);
    }
    let first = |f: &mut Option<FirstFailure>| {
        if let Some(f) = f {
            fill(&mut f.host);
        }
    };
    first(&mut v.first_failure);
    first(&mut v.previous_failure);
    for f in v.consequences.iter_mut().chain(&mut v.other_failures) {
        fill(&mut f.host);
    }
    if v.hosts.is_empty() && !v.members.is_empty() {
        let mut hosts: Vec<String> = v.members.iter().filter_map(|m| m.host.clone()).collect();
        hosts.sort();
        hosts.dedup();
        v.hosts = hosts;
    }
    v
}

#[cfg(test)]
mod tests;
