//! Processes in a delta answer: a GPU whose processes hash as they did in the cursor's answer
//! has them left out, its index listed in `processes_kept`. On a node where most processes hold
//! their memory from one poll to the next, most GPUs' lists are sent once.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::cursor::Cursor;
use crate::core::detect::orphan::Orphans;
use crate::core::model::{ProcInfo, ProcState, ProcessReading};
use crate::core::store::sessions::nvml::joins;
use crate::core::store::sessions::Session;

/// A GPU process as the snapshot lists it, borrowed: its reading and the live trainer session
/// joined to it (`ProcessView::of` makes the view sent).
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub reading: &'a ProcessReading,
    pub session: Option<&'a str>,
    /// The pid the trainer sees itself as, from its hello.
    pub ns_pid: Option<u64>,
    /// Its process has exited and its orphaned_memory finding fires.
    pub orphaned: bool,
}

impl<'a> Row<'a> {
    /// `live`: live sessions by host pid, in start order.
    pub fn of(
        p: &'a ProcessReading,
        live: &HashMap<u32, Vec<&'a Session>>,
        orphans: &Orphans,
    ) -> Self {
        let s = live
            .get(&p.pid)
            .and_then(|v| v.iter().find(|s| joins(s, p)));
        Self {
            reading: p,
            session: s.map(|s| s.id.as_str()),
            ns_pid: s.and_then(|s| s.hello.ns_pid),
            // Asked only of the rare process /proc says has exited.
            orphaned: !ProcState::runs(&p.info.state) && orphans.orphaned(&p.uuid, p.pid),
        }
    }
}

/// (GPU index, hash) of each GPU's processes; None when they are not in GPU order (the poller
/// lists them so), as the client puts kept ones back by that order.
pub fn hashes(rows: &[Row]) -> Option<Vec<(u32, u64)>> {
    let mut out: Vec<(u32, u64)> = Vec::new();
    let mut hasher = Fast::default();
    for (i, r) in rows.iter().enumerate() {
        let gpu = r.reading.gpu;
        if i > 0 && rows[i - 1].reading.gpu != gpu {
            out.push((rows[i - 1].reading.gpu, hasher.finish()));
            hasher = Fast::default();
        }
        if out.last().is_some_and(|(g, _)| *g >= gpu) {
            return None;
        }
        hash_row(r, &mut hasher);
    }
    if let Some(r) = rows.last() {
        out.push((r.reading.gpu, hasher.finish()));
    }
    Some(out)
}

/// Every field the view serialises. The patterns name them all, so a field added to one of
/// these types does not build until it is hashed here too.
fn hash_row(r: &Row, h: &mut Fast) {
    let Row {
        reading,
        session,
        ns_pid,
        orphaned,
    } = r;
    let ProcessReading {
        gpu,
        uuid,
        pid,
        kind,
        used_memory_bytes,
        mig_uuid,
        gpu_instance_id,
        compute_instance_id,
        info,
    } = reading;
    let ProcInfo {
        name,
        user,
        uid,
        container,
        cgroup,
        pod_uid,
        pod,
        namespace,
        container_name,
        state,
        ppid,
        parent,
    } = &**info;
    (session, ns_pid, gpu, &**uuid, pid, kind.as_str()).hash(h);
    (used_memory_bytes, mig_uuid.as_deref(), gpu_instance_id).hash(h);
    (compute_instance_id, name, user, uid, container, cgroup).hash(h);
    (pod_uid, pod, namespace, container_name).hash(h);
    (state.map(|s| s.as_str()), ppid, parent, orphaned).hash(h);
}

/// The GPUs, in index order, whose processes hash as they did in `after`'s answer: the client
/// holds them, and they are left out.
pub fn kept(hashes: &[(u32, u64)], after: &Cursor) -> Vec<u32> {
    hashes
        .iter()
        .filter(|h| after.procs.binary_search(h).is_ok())
        .map(|(g, _)| *g)
        .collect()
}

/// FxHash's step, with a final mix: SipHash over the many small fields of 1,000 processes took
/// longer than the rest of a delta answer. Not keyed: a forged cursor can only hide processes
/// from the client that forged it.
#[derive(Default)]
struct Fast(u64);

impl Fast {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for Fast {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        }
        let mut tail = [0u8; 8];
        tail[..words.remainder().len()].copy_from_slice(words.remainder());
        self.add(u64::from_le_bytes(tail) ^ bytes.len() as u64);
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // murmur3's fmix64: every input bit reaches every output bit.
        let mut x = self.0;
        x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

// Its test builds readings with the TUI's fixtures, so it lives in the gpumon crate
// (src/core/tests/kept.rs).
