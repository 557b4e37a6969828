//! Puts a delta answer (`?since=`, `Snapshot::delta`) back together with the snapshot before
//! it, so the node holds what a whole answer would have held. GPU history needs nothing here:
//! the node keeps its own, appending points newer than its last.

use std::collections::HashMap;

use crate::core::snapshot::{ProcessView, SessionView, Snapshot, SESSION_POINTS};
use crate::core::store::Point;
use crate::core::trainer::SessionPoint;

/// Points a session keeps past the window before its oldest are dropped, all at once: dropping
/// one a refresh moved every session's 300 points (1.7 MB for 64 trainers) at every refresh.
/// Within the capacity the first point past the window doubled the series to.
const SLACK: usize = SESSION_POINTS / 4;

/// The points the views draw: the newest `SESSION_POINTS`, what a whole answer holds.
pub fn window(s: &SessionView) -> &[Point<SessionPoint>] {
    &s.series[s.series.len().saturating_sub(SESSION_POINTS)..]
}

/// Completes `new`, a delta answer to the cursor `old` came with.
pub fn delta(old: Snapshot, new: &mut Snapshot) {
    processes(old.processes, new);
    sessions(old.sessions, new);
}

/// Puts back the processes of the GPUs in `processes_kept`, in GPU order as the daemon lists
/// them.
fn processes(old: Vec<ProcessView>, new: &mut Snapshot) {
    let kept = std::mem::take(&mut new.processes_kept);
    if kept.is_empty() {
        return;
    }
    let mut sent = std::mem::take(&mut new.processes).into_iter().peekable();
    let mut out = Vec::with_capacity(old.len());
    for p in old.into_iter().filter(|p| kept.contains(&p.gpu)) {
        while let Some(s) = sent.next_if(|s| s.gpu < p.gpu) {
            out.push(s);
        }
        out.push(p);
    }
    out.extend(sent);
    new.processes = out;
}

/// Gives each session of `new` the points `old` held before its new ones. A session `old` did
/// not have came whole.
fn sessions(old: Vec<SessionView>, new: &mut Snapshot) {
    let mut held: HashMap<String, SessionView> =
        old.into_iter().map(|s| (s.session.clone(), s)).collect();
    for s in &mut new.sessions {
        let Some(before) = held.remove(&s.session) else {
            continue;
        };
        append(before, s);
    }
}

/// `s.series` holds the points numbered `s.samples - len + 1 ..= s.samples` (`samples` counts
/// every point the series took); those up to `before.samples` were held already.
fn append(before: SessionView, s: &mut SessionView) {
    if s.samples < before.samples {
        return;
    }
    let new = s.series.len() as u64;
    let dup = (before.samples + new).saturating_sub(s.samples).min(new) as usize;
    let mut series = before.series;
    series.extend(s.series.drain(dup..));
    if series.len() > SESSION_POINTS + SLACK {
        series.drain(..series.len() - SESSION_POINTS);
    }
    s.series = series;
}

#[cfg(test)]
mod tests;
