//! Whether a process NVML lists still runs (orphaned memory: a zombie, or no process at all),
//! and whether the /proc read shows the host's processes, so that a pid missing from it means
//! the process exited.

use std::path::Path;

use std::sync::Arc;

use super::{status_line, status_name, Entry, Reader};
use crate::core::model::{ProcInfo, ProcState, ProcView};

/// The inode of the initial PID namespace (`PROC_PID_INIT_INO`, fixed since Linux 3.8).
const INIT_PID_NS: &str = "pid:[4026531836]";

/// A state letter of /proc (`R`, `S`, `D`, `Z`, `X`...) as gpumon judges it.
fn state_of(letter: char) -> ProcState {
    match letter {
        'Z' => ProcState::Zombie,
        // Dead: the kernel is removing it.
        'X' | 'x' => ProcState::Gone,
        _ => ProcState::Running,
    }
}

/// What /proc/PID/stat says: the state, the parent and the start time (clock ticks after
/// boot), which tells a reused pid from the process first seen under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub state: ProcState,
    pub ppid: u32,
    pub start: u64,
}

/// Parses `pid (comm) S ppid pgrp ... starttime ...`: the name may hold spaces and parentheses,
/// so fields are counted from the last `)`. None for anything else.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = state_of(fields.next()?.chars().next()?);
    let ppid = fields.next()?.parse().ok()?;
    // starttime is field 22; the state was field 3.
    let start = fields.nth(22 - 5)?.parse().ok()?;
    Some(Stat { state, ppid, start })
}

/// The state and parent from /proc/PID/status (`State:\tZ (zombie)`, `PPid:\t80001`), read
/// anyway for the name and uid. A status without a state line is a running process's.
pub fn from_status(status: &str) -> (ProcState, Option<u32>) {
    let state = status_line(status, "State:")
        .and_then(|l| l["State:".len()..].trim_start().chars().next())
        .map_or(ProcState::Running, state_of);
    let ppid = status_line(status, "PPid:").and_then(|l| l["PPid:".len()..].trim().parse().ok());
    (state, ppid)
}

/// Which processes `root` shows. The host's when it is an outer PID namespace's /proc (its
/// `self` is not this process's pid: the host's /proc mounted in a container) or the initial
/// namespace's; this process's own namespace's otherwise. pid 1 is in every namespace's /proc,
/// so a /proc without it hides other users' processes (hidepid): a pid missing there may run.
pub fn view(root: &Path) -> ProcView {
    let me = std::process::id();
    let Some(self_pid) = link(&root.join("self")).and_then(|l| l.parse::<u32>().ok()) else {
        return ProcView::Unknown;
    };
    if !root.join("1").exists() {
        return ProcView::Own;
    }
    if self_pid != me {
        return ProcView::Host;
    }
    match link(&root.join("self/ns/pid")) {
        Some(ns) if ns == INIT_PID_NS => ProcView::Host,
        Some(_) => ProcView::Own,
        None => ProcView::Unknown,
    }
}

impl Reader {
    /// Asks /proc again whether `e`'s process runs (its stat file), and gives the entry new
    /// info when the answer changed. A pid whose start time differs from the one first read
    /// names another process now: the one NVML listed is gone.
    pub(super) fn recheck(&mut self, pid: u32, e: &mut Entry) {
        let stat = self.read(pid, "stat").and_then(parse_stat);
        let (state, ppid) = match stat {
            Some(s) if e.start.is_none_or(|first| first == s.start) => {
                e.start = Some(s.start);
                (s.state, Some(s.ppid))
            }
            _ => (ProcState::Gone, None),
        };
        let was = &e.info;
        if was.state == Some(state) && (state != ProcState::Zombie || was.ppid == ppid) {
            return;
        }
        let (ppid, parent) = self.parent(state, ppid);
        let mut info = ProcInfo::clone(was);
        info.state = Some(state);
        info.ppid = ppid;
        info.parent = parent;
        e.info = Arc::new(info);
    }

    /// A zombie's parent and its name (who has to reap it); nothing for any other process.
    pub(super) fn parent(
        &mut self,
        state: ProcState,
        ppid: Option<u32>,
    ) -> (Option<u32>, Option<String>) {
        match (state, ppid) {
            (ProcState::Zombie, Some(pp)) => {
                (Some(pp), self.read(pp, "status").and_then(status_name))
            }
            _ => (None, None),
        }
    }
}

fn link(path: &Path) -> Option<String> {
    std::fs::read_link(path)
        .ok()
        .and_then(|p| p.to_str().map(str::to_string))
}

#[cfg(test)]
mod tests;
