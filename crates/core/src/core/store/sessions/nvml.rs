//! NVML's figure for each session's process on its GPU, joined once per poll (host pid and
//! device UUID, MIG-aware), so detection sees the memory outside the caching allocator at each
//! sample. A recorded session's trace carries the figure (`trace_nvml`), and `gpumon analyze`
//! puts it back here: the same samples meet the same figures offline.

use std::collections::HashMap;

use super::{Session, Sessions};
use crate::core::ledger::{self, MAX_AGE_SECONDS};
use crate::core::model::{NodeReading, ProcInfo, ProcessReading, Timestamp};
use crate::core::trainer::Sample;

/// A trace notes an unchanged figure again after this long, so a replay pairs samples with a
/// figure as fresh as the live one was (within the ledger's `MAX_AGE_SECONDS`).
const RENOTE_SECONDS: f64 = 30.0;

/// NVML's used memory for a session's process on its GPU, when it is that session's alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NvmlFigure {
    pub used: u64,
    /// When NVML was polled.
    pub ts: Timestamp,
}

/// A session is an NVML process entry when the kernel's pid for its socket is the host pid NVML
/// reports and its device UUID is that GPU's (or, under MIG, that MIG device's).
pub fn joins(s: &Session, p: &ProcessReading) -> bool {
    s.peer.pid == p.pid
        && s.hello
            .gpu_uuid
            .as_deref()
            .is_some_and(|u| u == &*p.uuid || p.mig_uuid.as_deref() == Some(u))
}

/// A session's process as NVML lists it: the one session ↔ process join every reader uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessOf<'a> {
    /// Its entry on the session's GPU (`joins`): NVML's memory figure for it there.
    pub entry: Option<&'a ProcessReading>,
    /// The process's own facts (name, user, container, pod): the entry's or, when the session's
    /// GPU lists no entry for it (a device UUID NVML does not report, a process not yet on the
    /// GPU), any entry of its pid: a process is in one container whichever device it uses.
    pub info: Option<&'a ProcInfo>,
}

/// Session `s`'s process among `procs`, one collection's entries (`Store::process_of` passes
/// only those of the session's pid).
pub fn process_of<'a>(
    s: &Session,
    procs: impl Iterator<Item = &'a ProcessReading> + Clone,
) -> ProcessOf<'a> {
    let entry = procs.clone().find(|p| joins(s, p));
    let info = entry
        .or_else(|| procs.clone().find(|p| p.pid == s.peer.pid))
        .map(|p| &*p.info);
    ProcessOf { entry, info }
}

/// The process's memory outside the caching allocator at sample `s`, as the ledger counts it,
/// when `figure` is recent enough to pair with it.
pub fn outside_at(figure: Option<NvmlFigure>, s: &Sample) -> Option<u64> {
    let f = figure?;
    ledger::ledger(&ledger::Inputs {
        nvml_used: Some(f.used),
        poll_ts: Some(f.ts),
        stats: Some(&s.stats),
        sample_ts: Some(s.ts),
        sessions_sharing: 1,
    })
    .outside_allocator_bytes
}

impl Sessions {
    /// A poll: each live session takes NVML's figure for its process, or none when the process
    /// is not listed or other sessions share it (NVML's figure is then theirs together).
    pub fn polled(&mut self, r: &NodeReading) {
        let mut found: Vec<(u64, Option<usize>)> = Vec::with_capacity(self.live.len());
        let mut sharing: HashMap<usize, usize> = HashMap::new();
        for (key, s) in &self.live {
            let i = r.processes.iter().position(|p| joins(s, p));
            if let Some(i) = i {
                *sharing.entry(i).or_default() += 1;
            }
            found.push((*key, i));
        }
        for (key, i) in found {
            let figure = i.and_then(|i| {
                let p = &r.processes[i];
                let alone = sharing.get(&i).copied() == Some(1);
                p.used_memory_bytes
                    .filter(|_| alone)
                    .map(|used| NvmlFigure { used, ts: r.ts })
            });
            if let Some(s) = self.live.get_mut(&key) {
                s.nvml = figure;
            }
        }
    }

    /// A replayed `trace_nvml` line: the figure the daemon had for this session then.
    pub fn noted_nvml(&mut self, key: u64, figure: Option<NvmlFigure>) {
        if let Some(s) = self.live.get_mut(&key) {
            s.nvml = figure;
        }
    }

    /// The `trace_nvml` line to write before the session's next line, when its figure changed
    /// since `last` (what the trace holds) or was noted long enough ago; updates `last`.
    pub fn nvml_line(&self, key: u64, last: &mut Option<NvmlFigure>) -> Option<Vec<u8>> {
        let now = self.live.get(&key)?.nvml;
        let due = match (now, *last) {
            (None, None) => false,
            (Some(n), Some(l)) => {
                n.used != l.used || n.ts - l.ts >= RENOTE_SECONDS.min(MAX_AGE_SECONDS)
            }
            _ => true,
        };
        if !due {
            return None;
        }
        let ts = now.map(|n| n.ts);
        *last = now;
        Some(crate::core::trace::nvml_line(now.map(|n| n.used), ts))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::core::jobs::Jobs;
    use crate::core::model::{ProcInfo, ProcessKind};
    use crate::core::store::sessions::SessionLimits;
    use crate::core::trainer::{Hello, Peer};

    /// A compute process NVML lists on GPU 0 (`uuid`) using `used` bytes.
    pub(in crate::core::store::sessions) fn process(
        pid: u32,
        uuid: &str,
        used: u64,
    ) -> ProcessReading {
        ProcessReading {
            gpu: 0,
            uuid: uuid.into(),
            pid,
            kind: ProcessKind::Compute,
            used_memory_bytes: Some(used),
            mig_uuid: None,
            gpu_instance_id: None,
            compute_instance_id: None,
            info: std::sync::Arc::new(ProcInfo::default()),
        }
    }

    fn open(s: &mut Sessions, jobs: &mut Jobs, pid: u32, uuid: &str) -> u64 {
        let hello = Hello {
            gpu_uuid: Some(uuid.into()),
            ..Hello::default()
        };
        let peer = Peer {
            pid,
            uid: 1000,
            gid: 1000,
        };
        s.open(jobs, peer, hello, 1.0).0
    }

    fn reading(ts: f64, processes: Vec<ProcessReading>) -> NodeReading {
        NodeReading {
            ts,
            driver_version: None,
            gpus: vec![],
            processes,
        }
    }

    #[test]
    fn a_session_takes_its_process_figure_unless_shared() {
        let mut s = Sessions::new(SessionLimits::default());
        let mut jobs = Jobs::default();
        let a = open(&mut s, &mut jobs, 10, "GPU-a");
        let b1 = open(&mut s, &mut jobs, 20, "GPU-a");
        let b2 = open(&mut s, &mut jobs, 20, "GPU-a");
        let c = open(&mut s, &mut jobs, 30, "GPU-b");
        s.polled(&reading(
            5.0,
            vec![
                process(10, "GPU-a", 3 << 30),
                process(20, "GPU-a", 5 << 30),
                process(30, "GPU-a", 1 << 30),
            ],
        ));
        let fig = |k| s.live.get(&k).unwrap().nvml;
        assert_eq!(
            fig(a),
            Some(NvmlFigure {
                used: 3 << 30,
                ts: 5.0
            })
        );
        // Two sessions of one process: NVML's figure is theirs together.
        assert_eq!(fig(b1), None);
        assert_eq!(fig(b2), None);
        // Pid 30 is listed on another GPU than the one its session named.
        assert_eq!(fig(c), None);
    }

    #[test]
    fn the_trace_notes_a_figure_when_it_changes_or_ages() {
        // A daemon's clock: the trace reads back only a Unix time.
        const T: f64 = 1_763_700_000.0;
        let mut s = Sessions::new(SessionLimits::default());
        let mut jobs = Jobs::default();
        let a = open(&mut s, &mut jobs, 10, "GPU-a");
        let mut last = None;
        assert_eq!(s.nvml_line(a, &mut last), None);
        s.polled(&reading(T + 5.0, vec![process(10, "GPU-a", 3 << 30)]));
        let line = s.nvml_line(a, &mut last).unwrap();
        assert_eq!(
            crate::core::trace::recorder_line(&line),
            Some(crate::core::trace::RecorderLine::Nvml(
                Some(3 << 30),
                Some(T + 5.0)
            ))
        );
        s.polled(&reading(T + 6.0, vec![process(10, "GPU-a", 3 << 30)]));
        assert_eq!(s.nvml_line(a, &mut last), None, "unchanged");
        s.polled(&reading(T + 36.0, vec![process(10, "GPU-a", 3 << 30)]));
        assert!(
            s.nvml_line(a, &mut last).is_some(),
            "noted again after 30 s"
        );
        s.polled(&reading(T + 37.0, vec![process(10, "GPU-a", 4 << 30)]));
        assert!(s.nvml_line(a, &mut last).is_some(), "changed");
        s.polled(&reading(T + 38.0, vec![]));
        let gone = s.nvml_line(a, &mut last).unwrap();
        assert_eq!(
            crate::core::trace::recorder_line(&gone),
            Some(crate::core::trace::RecorderLine::Nvml(None, None))
        );
    }
}
