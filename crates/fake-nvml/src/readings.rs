//! What a device reports at scenario time t, computed from the scenario. Pure functions, so the
//! FFI layer only marshals.

use crate::ret::Ret;
use crate::scenario::{Call, Gpu, Kind, Scenario};
use crate::value::{to_u64, Value};

/// `gpuInstanceId` / `computeInstanceId` of a process that is not in a MIG instance.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// Upper bound on live churn processes per GPU, so a mistyped rate cannot make a call loop for
/// minutes or allocate gigabytes.
const MAX_CHURN_LIVE: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: u32,
    /// `None` is "n/a" (NVML_VALUE_NOT_AVAILABLE).
    pub used: Option<u64>,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub kind: Kind,
}

fn alive(start: f64, end: Option<f64>, t: f64) -> bool {
    start <= t && end.is_none_or(|e| t < e)
}

fn instance_ids(gpu: &Gpu, mig: Option<usize>) -> (u32, u32) {
    match mig.and_then(|m| gpu.migs.get(m)) {
        Some(m) if gpu.mig_mode => (m.gpu_instance_id, m.compute_instance_id),
        _ => (NO_INSTANCE, NO_INSTANCE),
    }
}

fn used_at(v: &Value, t: f64, offset: f64) -> Option<u64> {
    v.at(t).map(|u| to_u64(u + offset))
}

/// Calls `f` for every process alive on `gpu` at `t`, in scenario order (listed processes, then
/// groups, then churn). With `only_mig = Some(m)`, only processes in MIG device `m`.
pub fn for_each_process(gpu: &Gpu, only_mig: Option<usize>, t: f64, mut f: impl FnMut(ProcEntry)) {
    let wanted = |mig: Option<usize>| only_mig.is_none() || only_mig == mig;
    for p in &gpu.processes {
        if wanted(p.mig) && alive(p.start, p.end, t) {
            let (gi, ci) = instance_ids(gpu, p.mig);
            f(ProcEntry {
                pid: p.pid,
                used: used_at(&p.used, t, 0.0),
                gpu_instance_id: gi,
                compute_instance_id: ci,
                kind: p.kind,
            });
        }
    }
    for grp in &gpu.process_groups {
        if wanted(grp.mig) && alive(grp.start, grp.end, t) {
            let (gi, ci) = instance_ids(gpu, grp.mig);
            for k in 0..grp.count {
                f(ProcEntry {
                    pid: grp.pid_base.wrapping_add(k.wrapping_mul(grp.pid_step)),
                    used: used_at(&grp.used, t, f64::from(k) * grp.used_step),
                    gpu_instance_id: gi,
                    compute_instance_id: ci,
                    kind: grp.kind,
                });
            }
        }
    }
    if let Some(c) = &gpu.churn {
        if wanted(c.mig) && alive(c.start, c.end, t) {
            let (gi, ci) = instance_ids(gpu, c.mig);
            let since = t - c.start;
            // Process k is alive for k/rate <= since < k/rate + lifetime. Scan one extra index on
            // each side and test exactly, so float rounding cannot drop or add a process.
            let hi = (since * c.rate_per_s).floor().max(0.0) as u64 + 1;
            let lo = (((since - c.lifetime_s) * c.rate_per_s).floor().max(0.0) as u64)
                .max(hi.saturating_sub(MAX_CHURN_LIVE));
            let lo = lo.saturating_sub(1);
            for k in lo..=hi {
                let born = k as f64 / c.rate_per_s;
                if born <= since && since < born + c.lifetime_s {
                    f(ProcEntry {
                        pid: c.pid_base.wrapping_add(k as u32),
                        used: used_at(&c.used, t, 0.0),
                        gpu_instance_id: gi,
                        compute_instance_id: ci,
                        kind: c.kind,
                    });
                }
            }
        }
    }
}

/// Which process-list call is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    Compute,
    Graphics,
    Mps,
}

impl ListKind {
    pub fn includes(self, k: Kind) -> bool {
        matches!(
            (self, k),
            (ListKind::Compute, Kind::Compute | Kind::Both)
                | (ListKind::Graphics, Kind::Graphics | Kind::Both)
                | (ListKind::Mps, Kind::Mps)
        )
    }
}

pub fn process_list(gpu: &Gpu, only_mig: Option<usize>, t: f64, list: ListKind) -> Vec<ProcEntry> {
    let mut out = Vec::new();
    for_each_process(gpu, only_mig, t, |p| {
        if list.includes(p.kind) {
            out.push(p)
        }
    });
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mem {
    pub total: u64,
    pub reserved: u64,
    /// v2 semantics: excludes `reserved`.
    pub used: u64,
}

impl Mem {
    pub fn free(&self) -> u64 {
        self.total
            .saturating_sub(self.reserved)
            .saturating_sub(self.used)
    }

    /// The v1 struct folds reserved memory into `used`, as real drivers do.
    pub fn v1_used(&self) -> u64 {
        self.used.saturating_add(self.reserved)
    }

    pub fn v1_free(&self) -> u64 {
        self.total.saturating_sub(self.v1_used())
    }
}

/// Memory of the physical GPU (`mig = None`) or of MIG device `mig`: the extra term plus every
/// process's available `used`, each process counted once whatever its kind.
pub fn memory(gpu: &Gpu, mig: Option<usize>, t: f64) -> Mem {
    let (total, reserved, extra) = match mig.and_then(|m| gpu.migs.get(m)) {
        Some(m) => (m.memory_total, m.memory_reserved, &m.memory_used_extra),
        None => (
            gpu.memory_total,
            gpu.memory_reserved,
            &gpu.memory_used_extra,
        ),
    };
    let mut used = extra.as_ref().and_then(|v| v.at(t)).map_or(0, to_u64);
    for_each_process(gpu, mig, t, |p| {
        used = used.saturating_add(p.used.unwrap_or(0))
    });
    Mem {
        total,
        reserved,
        used,
    }
}

/// The first injected fault in force for `call` on `gpu` at `t`.
pub fn fault(gpu: &Gpu, call: Call, t: f64) -> Option<Ret> {
    gpu.faults
        .iter()
        .find(|f| (f.call == call || f.call == Call::Any) && alive(f.from, f.until, t))
        .map(|f| f.error.code())
}

/// `nvmlSystemGetProcessName`: a scenario pid gets its `name` (default "proc<pid>"); any other pid
/// gets the host's /proc/<pid>/comm, as the real library reads the OS.
pub fn process_name(s: &Scenario, pid: u32) -> Option<String> {
    let default = || format!("proc{pid}");
    for gpu in &s.gpus {
        if let Some(p) = gpu.processes.iter().find(|p| p.pid == pid) {
            return Some(p.name.clone().unwrap_or_else(default));
        }
        for grp in &gpu.process_groups {
            let off = pid.wrapping_sub(grp.pid_base);
            if pid >= grp.pid_base && off % grp.pid_step == 0 && off / grp.pid_step < grp.count {
                return Some(grp.name.clone().unwrap_or_else(default));
            }
        }
    }
    if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        return Some(comm.trim_end().to_owned());
    }
    for gpu in &s.gpus {
        if let Some(c) = gpu.churn.as_ref().filter(|c| pid >= c.pid_base) {
            return Some(c.name.clone().unwrap_or_else(default));
        }
    }
    None
}

/// Default UUID for GPU `g`: stable and recognisably fake.
pub fn gpu_uuid(s: &Scenario, g: usize) -> String {
    match s.gpus.get(g).and_then(|gpu| gpu.uuid.clone()) {
        Some(u) => u,
        None => format!("GPU-fa4e0000-0000-4000-8000-{g:012x}"),
    }
}

pub fn mig_uuid(s: &Scenario, g: usize, m: usize) -> String {
    match s
        .gpus
        .get(g)
        .and_then(|gpu| gpu.migs.get(m))
        .and_then(|mig| mig.uuid.clone())
    {
        Some(u) => u,
        None => format!("MIG-fa4e0000-0000-4000-8000-{g:06x}{m:06x}"),
    }
}

pub fn mig_name(gpu: &Gpu, m: usize) -> String {
    match gpu.migs.get(m) {
        Some(mig) => match (&mig.name, &mig.profile) {
            (Some(n), _) => n.clone(),
            (None, Some(p)) => format!("{} MIG {p}", gpu.name),
            (None, None) => format!("{} MIG", gpu.name),
        },
        None => gpu.name.clone(),
    }
}

/// "DDDDDDDD:BB:DD.F" for GPU `g`; the default puts GPU g on bus 0x10 * (g + 1).
pub fn pci_bus_id(s: &Scenario, g: usize) -> String {
    match s.gpus.get(g).and_then(|gpu| gpu.pci_bus_id.clone()) {
        Some(p) => p,
        None => format!("00000000:{:02X}:00.0", (0x10 * (g + 1)) & 0xFF),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(text: &str) -> Gpu {
        Scenario::parse(text).unwrap().gpus.remove(0)
    }

    #[test]
    fn memory_is_extra_plus_processes() {
        let g = gpu(
            "[[gpu]]\nmemory_total = 1000\nmemory_reserved = 100\nmemory_used_extra = 50\n\
             [[gpu.process]]\npid = 1\nused = 200\n[[gpu.process]]\npid = 2\nused = \"n/a\"\n\
             [[gpu.process]]\npid = 3\nused = 300\nkind = \"graphics\"\nstart = 5\n",
        );
        let m = memory(&g, None, 0.0);
        assert_eq!(
            (m.used, m.free(), m.v1_used(), m.v1_free()),
            (250, 650, 350, 650)
        );
        assert_eq!(memory(&g, None, 5.0).used, 550);
        let compute = process_list(&g, None, 10.0, ListKind::Compute);
        assert_eq!(
            compute.iter().map(|p| p.pid).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(compute[1].used, None);
        assert_eq!(compute[0].gpu_instance_id, NO_INSTANCE);
        assert_eq!(process_list(&g, None, 10.0, ListKind::Graphics).len(), 1);
    }

    #[test]
    fn churn_population_is_rate_times_lifetime() {
        let g = gpu("[[gpu]]\nmemory_total = 1\n[gpu.churn]\nrate_per_s = 50\nlifetime_s = 0.5\npid_base = 1000\n");
        for t in [10.0, 10.013, 33.333] {
            let n = process_list(&g, None, t, ListKind::Compute).len();
            assert_eq!(n, 25, "at t={t}");
        }
        let first = process_list(&g, None, 0.0, ListKind::Compute);
        assert_eq!(first.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![1000]);
        let at_10 = process_list(&g, None, 10.0, ListKind::Compute);
        assert_eq!(at_10[0].pid, 1000 + 476);
        assert_eq!(at_10[24].pid, 1000 + 500);
    }

    #[test]
    fn groups_step_pids_and_memory() {
        let g = gpu("[[gpu]]\nmemory_total = 10000\n[[gpu.process_group]]\ncount = 3\npid_base = 10\npid_step = 2\nused = 100\nused_step = 10\n");
        let l = process_list(&g, None, 0.0, ListKind::Compute);
        assert_eq!(
            l.iter().map(|p| (p.pid, p.used)).collect::<Vec<_>>(),
            vec![(10, Some(100)), (12, Some(110)), (14, Some(120))]
        );
        assert_eq!(memory(&g, None, 0.0).used, 330);
    }
}
