//! gpumon_trainer_* families, encoded on the aggregator's thread when a scrape syncs and
//! sessions changed since the last encode (at most once per publish gap). The ingest counters
//! are ingest's own health (sources/ingest/health.rs), encoded per scrape.

use std::collections::HashMap;

use crate::core::categories::Split;
use crate::core::store::sessions::Session;
use crate::core::store::Store;
use crate::util::family::{Family, Kind};

pub const T: &[&str] = &[
    "gpu",
    "uuid",
    "pid",
    "job_name",
    "rank",
    "container",
    "namespace",
    "pod",
];

/// `T` and the category of `gpumon_trainer_memory_bytes` (docs/categories.md).
const TC: &[&str] = &[
    "gpu",
    "uuid",
    "pid",
    "job_name",
    "rank",
    "container",
    "namespace",
    "pod",
    "category",
];

/// Labels left out of trainer series where empty: what a trainer outside a container or pod
/// carries is what it carried before these labels existed.
pub const OMITTED: &[&str] = &["container", "namespace", "pod"];

/// Live sessions with their labels, as `labelled` gives them: built once per encoding and used
/// by the trainer and the finding families alike.
pub type Labelled<'a> = [(Labels, &'a Session, bool)];

pub fn session_families(store: &Store, sessions: &Labelled, out: &mut String) {
    let mut info = Family::gauge(
        "gpumon_trainer_info",
        "Instrumented trainer session; always 1.",
        &[
            "gpu",
            "uuid",
            "pid",
            "job_name",
            "rank",
            "session",
            "torch",
            "client",
            "container",
            "namespace",
            "pod",
            "run_id",
            "uid",
        ],
    )
    // run_id and uid join a trainer's series to its job (gpumon_job_info); run_id is absent
    // without one.
    .omitting_empty(&["container", "namespace", "pod", "run_id"]);
    let g = |name: &'static str, help: &'static str| {
        Family::gauge(name, help, T).omitting_empty(OMITTED)
    };
    let mut allocated = g(
        "gpumon_trainer_allocated_bytes",
        "PyTorch allocated_bytes.all.current.",
    );
    let mut peak = g(
        "gpumon_trainer_allocated_peak_bytes",
        "PyTorch allocated_bytes.all.peak.",
    );
    let mut reserved = g(
        "gpumon_trainer_reserved_bytes",
        "PyTorch reserved_bytes.all.current.",
    );
    let mut active = g(
        "gpumon_trainer_active_bytes",
        "PyTorch active_bytes.all.current.",
    );
    let mut inactive = g(
        "gpumon_trainer_inactive_split_bytes",
        "PyTorch inactive_split_bytes.all.current.",
    );
    let mut alloc_limit = g(
        "gpumon_trainer_alloc_limit_bytes",
        "Cap on the trainer's caching allocator (torch.cuda.set_per_process_memory_fraction), as reported; absent when none was.",
    );
    let mut outside = g(
        "gpumon_trainer_outside_allocator_bytes",
        "NVML's used memory of the trainer's process on its GPU minus the caching allocator's reserved bytes: the CUDA context, NCCL, cuBLAS/cuDNN workspaces, raw cudaMalloc. Absent when it cannot be known (the API's ledger says why).",
    );
    let mut step = g("gpumon_trainer_step", "Last step the trainer reported.");
    let mut last = g(
        "gpumon_trainer_last_sample_timestamp_seconds",
        "When the last sample arrived (Unix seconds).",
    );
    let mut frag = g(
        "gpumon_fragmentation_ratio",
        "(reserved - allocated) / reserved of the trainer's caching allocator.",
    );
    let c = |name: &'static str, help: &'static str| {
        Family::new(name, help, Kind::Counter, T).omitting_empty(OMITTED)
    };
    let mut retries = c(
        "gpumon_trainer_alloc_retries_total",
        "Allocator retries after a failed cudaMalloc (num_alloc_retries, resets handled).",
    );
    let mut ooms = c(
        "gpumon_trainer_ooms_total",
        "Out-of-memory errors the allocator raised (num_ooms, resets handled).",
    );
    let mut survived = c(
        "gpumon_trainer_ooms_survived_total",
        "Of gpumon_trainer_ooms_total, those a sample came after: the trainer caught them and went on (e.g. batch-size search).",
    );
    // Where the memory goes (docs/categories.md): the latest measured split, and what fits.
    let mut memory = Family::gauge(
        "gpumon_trainer_memory_bytes",
        "Bytes of the trainer's step peak by category, from the latest measured split (measured on one step every few minutes): parameters, gradients, optimizer_state, buffers, activations (absent when the client could not measure them), and other (the allocated peak less the rest: temporaries, workspaces; absent without a peak).",
        TC,
    )
    .omitting_empty(OMITTED);
    let mut batch_size = g(
        "gpumon_trainer_batch_size",
        "Batch size of the trainer's latest measured split; absent when the client could not tell.",
    );
    let mut safe_batch = g(
        "gpumon_trainer_largest_safe_batch",
        "Largest batch whose step peak the latest split predicts under the allocator's limit less a margin (activations and temporaries scaled with the batch); absent when unknown.",
    );
    let mut shadowed = Family::gauge(
        "gpumon_trainer_sessions_shadowed",
        "Live sessions whose per-session series are left out because a newer session carries the same gpu, uuid, pid, job_name and rank labels (e.g. a reconnect before the old connection closed); their gpumon_trainer_info is kept.",
        &[],
    );
    let mut hidden = 0;
    for (own, s, shown) in sessions {
        let l = own.as_array(s);
        let [gpu, uuid, pid, job, rank, container, ns, pod] = l;
        let torch = s.hello.torch.as_deref().unwrap_or("");
        let client = s.hello.client.as_deref().unwrap_or("");
        let run_id = s.hello.run_id.as_deref().unwrap_or("");
        let uid = s.peer.uid.to_string();
        info.add(
            &[
                gpu, uuid, pid, job, rank, &s.id, torch, client, container, ns, pod, run_id, &uid,
            ],
            1.0,
        );
        if !shown {
            hidden += 1;
            continue;
        }
        retries.add(&l, s.retries.total as f64);
        ooms.add(&l, s.ooms.total as f64);
        survived.add(&l, s.ooms_survived as f64);
        if let Some(cap) = s.alloc_limit {
            alloc_limit.add(&l, cap as f64);
        }
        if let Some(split) = s.categories.latest() {
            split_series(split, &l, &mut memory);
            if let Some(b) = split.measured.batch_size {
                batch_size.add(&l, b as f64);
            }
            if let Some(f) = s.batch_fit() {
                safe_batch.add(&l, f.largest_safe_batch as f64);
            }
        }
        let Some((_, sample)) = &s.last_sample else {
            continue;
        };
        let st = &sample.stats;
        for (fam, v) in [
            (&mut allocated, st.allocated),
            (&mut peak, st.allocated_peak),
            (&mut reserved, st.reserved),
            (&mut active, st.active),
            (&mut inactive, st.inactive_split),
            (&mut step, sample.step),
        ] {
            if let Some(v) = v {
                fam.add(&l, v as f64);
            }
        }
        if let Some(f) = st.fragmentation() {
            frag.add(&l, f);
        }
        let ledger = crate::core::snapshot::session_ledger(s, store);
        if let Some(b) = ledger.and_then(|x| x.outside_allocator_bytes) {
            outside.add(&l, b as f64);
        }
        if let Some(t) = s.last_arrival {
            last.add(&l, t);
        }
    }
    shadowed.add(&[], f64::from(hidden));
    let mut clamped = Family::new(
        "gpumon_ingest_timestamps_clamped_total",
        "Samples whose ts was over an hour behind or five minutes ahead of their arrival (taken at their arrival time instead), and events dated before their session's previous line (taken at its time).",
        Kind::Counter,
        &[],
    );
    clamped.add(&[], store.sessions.timestamps_clamped as f64);
    for f in [
        info,
        shadowed,
        clamped,
        allocated,
        peak,
        reserved,
        active,
        inactive,
        alloc_limit,
        outside,
        retries,
        ooms,
        survived,
        step,
        last,
        frag,
        memory,
        batch_size,
        safe_batch,
    ] {
        f.finish(out);
    }
}

/// One series per category of `split`, labelled `l` and the category.
fn split_series(split: &Split, l: &[&str; LABELS], fam: &mut Family) {
    let c = &split.measured;
    let activations = c.activations_known().then_some(c.activations_bytes);
    for (category, v) in [
        ("parameters", Some(c.parameters_bytes)),
        ("gradients", Some(c.gradients_bytes)),
        ("optimizer_state", Some(c.optimizer_state_bytes)),
        ("buffers", Some(c.buffers_bytes)),
        ("activations", activations),
        ("other", split.other_bytes),
    ] {
        let Some(v) = v else { continue };
        let [gpu, uuid, pid, job, rank, container, ns, pod] = *l;
        fam.add(
            &[gpu, uuid, pid, job, rank, container, ns, pod, category],
            v as f64,
        );
    }
}

/// Live sessions in start order with their labels, and whether their per-session series are
/// exported: of sessions with the same label set only the newest is, so an exposition never
/// holds two series with one label set (Prometheus would keep one of them, silently).
pub fn labelled(store: &Store) -> Vec<(Labels, &Session, bool)> {
    let mut out: Vec<_> = store
        .sessions
        .live()
        .map(|s| (Labels::of(s, store), s, true))
        .collect();
    let mut newest: HashMap<[&str; LABELS], usize> = HashMap::with_capacity(out.len());
    for (i, (own, s, _)) in out.iter().enumerate() {
        newest.insert(own.as_array(s), i);
    }
    let hidden: Vec<usize> = out
        .iter()
        .enumerate()
        .filter(|(i, (own, s, _))| newest.get(&own.as_array(s)) != Some(i))
        .map(|(i, _)| i)
        .collect();
    for i in hidden {
        out[i].2 = false;
    }
    out
}

const LABELS: usize = 8;

/// The labels every per-session series carries (`T`): gpu, uuid, pid, job_name (the trainer's
/// job name; `job` is Prometheus's own, the scrape job) and rank, and the container, namespace
/// and pod of the session's process as its GPU process entry has them (empty, and so left out,
/// outside a container or before NVML lists the process).
pub struct Labels {
    gpu: String,
    pid: String,
    rank: String,
    container: String,
    namespace: String,
    pod: String,
}

impl Labels {
    pub fn of(s: &Session, store: &Store) -> Self {
        let uuid = s.hello.gpu_uuid.as_deref().unwrap_or("");
        // As the API's session view has it (the core's one join).
        let info = store.process_of(s).info;
        let field = |f: fn(&crate::core::model::ProcInfo) -> &Option<String>| {
            info.and_then(|i| f(i).clone()).unwrap_or_default()
        };
        Self {
            container: field(|i| &i.container),
            namespace: field(|i| &i.namespace),
            pod: field(|i| &i.pod),
            // MIG-aware: a MIG device's UUID is labelled with its parent's index.
            gpu: store
                .gpu_index(uuid)
                .map(|g| g.to_string())
                .unwrap_or_default(),
            pid: s.peer.pid.to_string(),
            rank: s.hello.rank.map(|r| r.to_string()).unwrap_or_default(),
        }
    }

    pub fn as_array<'a>(&'a self, s: &'a Session) -> [&'a str; LABELS] {
        [
            &self.gpu,
            s.hello.gpu_uuid.as_deref().unwrap_or(""),
            &self.pid,
            s.hello.job.as_deref().unwrap_or(""),
            &self.rank,
            &self.container,
            &self.namespace,
            &self.pod,
        ]
    }
}

#[cfg(test)]
mod tests;
