//! /metrics. Families are built from the store as "const metrics" (the node_exporter pattern):
//! series exist only for what the latest collection saw, so ended processes vanish with no
//! bookkeeping. They are encoded where the data changes, not per scrape: the NVML families on
//! the poller's thread after each collection, the trainer and finding families by the
//! aggregator when it publishes a view; a scrape joins the two texts from the latest view and
//! encodes only the daemon's own counters.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use prometheus::proto::MetricFamily;
use prometheus::{Registry, TextEncoder};

use crate::core::model::{GpuState, NodeReading};

mod findings;
pub mod gzip;
mod jobs;
mod orphans;
mod trainers;
mod unified;
use crate::core::store::{NvmlStatus, Store};
use crate::core::view::View;
use crate::util::family::{Family, Kind};
use crate::util::health::Health;
use gzip::GzPrefix;

/// Collections are deflated ahead of the scrape while a gzip scrape came within this many
/// seconds (Prometheus scrapes every 15-60 s); otherwise nobody would read the result.
const GZIP_AHEAD_FOR: f64 = 300.0;
const GPU: &[&str] = &["gpu", "uuid"];
const PROC: &[&str] = &[
    "gpu",
    "uuid",
    "pid",
    "process",
    "container",
    "namespace",
    "pod",
];

/// The NVML families of one collection as text (the poller's encoder).
pub fn gpu_text(n: &NvmlStatus, latest: Option<&NodeReading>) -> String {
    let mut out = String::new();
    nvml_families(n, &mut out);
    if let Some(r) = latest {
        gpu_series(r, &mut out);
        unified::unified_families(r, &mut out);
        process_series(r, &mut out);
    }
    out
}

/// The trainer and finding families of a store as text (the aggregator's encoder).
pub fn trainer_text(store: &Store) -> String {
    let mut out = String::new();
    let sessions = trainers::labelled(store);
    trainers::session_families(store, &sessions, &mut out);
    findings::finding_families(store, &sessions, &mut out);
    jobs::job_families(store, &mut out);
    orphans::orphan_families(store, &mut out);
    out
}

/// NVML's own health: up, the last poll's duration, polls and errors.
fn nvml_families(n: &NvmlStatus, out: &mut String) {
    let mut f = Family::gauge(
        "gpumon_nvml_up",
        "1 when the last NVML poll succeeded.",
        &[],
    );
    f.add(&[], if n.up { 1.0 } else { 0.0 });
    f.finish(out);
    let mut f = Family::gauge(
        "gpumon_nvml_poll_duration_seconds",
        "Duration of the last NVML poll in seconds.",
        &[],
    );
    f.add(&[], n.last_poll_duration_seconds);
    f.finish(out);
    let mut f = Family::new(
        "gpumon_nvml_polls_total",
        "NVML polls attempted since start.",
        Kind::Counter,
        &[],
    );
    f.add(&[], n.polls_total as f64);
    f.finish(out);
    let mut f = Family::new(
        "gpumon_nvml_poll_errors_total",
        "NVML polls that could not read the node at all.",
        Kind::Counter,
        &[],
    );
    f.add(&[], n.poll_errors_total as f64);
    f.finish(out);
}

fn gpu_series(r: &NodeReading, out: &mut String) {
    let driver = r.driver_version.as_deref().unwrap_or("");
    let mut info = Family::gauge(
        "gpumon_gpu_info",
        "GPU identity; always 1.",
        &["gpu", "uuid", "name", "pci_bus_id", "driver_version"],
    );
    let mut up = Family::gauge(
        "gpumon_gpu_up",
        "1 when the GPU answered the last poll, 0 when it is lost or failing.",
        GPU,
    );
    let mut total = Family::gauge(
        "gpumon_gpu_memory_total_bytes",
        "Total GPU memory in bytes (NVML).",
        GPU,
    );
    let mut used = Family::gauge(
        "gpumon_gpu_memory_used_bytes",
        "Used GPU memory in bytes (NVML v2, excludes reserved).",
        GPU,
    );
    let mut free = Family::gauge(
        "gpumon_gpu_memory_free_bytes",
        "Free GPU memory in bytes (NVML).",
        GPU,
    );
    let mut reserved = Family::gauge(
        "gpumon_gpu_memory_reserved_bytes",
        "GPU memory reserved by the driver and firmware in bytes (NVML v2).",
        GPU,
    );
    let mut util = Family::gauge(
        "gpumon_gpu_utilization_ratio",
        "Fraction of the last sample period in which a kernel ran (0..1).",
        GPU,
    );
    let mut temp = Family::gauge(
        "gpumon_gpu_temperature_celsius",
        "GPU core temperature in degrees Celsius.",
        GPU,
    );
    let mut power = Family::gauge(
        "gpumon_gpu_power_watts",
        "GPU board power draw in watts.",
        GPU,
    );
    let mig_labels: &'static [&'static str] = &[
        "gpu",
        "uuid",
        "mig_uuid",
        "gpu_instance",
        "compute_instance",
    ];
    let mut mig_total = Family::gauge(
        "gpumon_mig_memory_total_bytes",
        "Memory of a MIG device in bytes.",
        mig_labels,
    );
    let mut mig_used = Family::gauge(
        "gpumon_mig_memory_used_bytes",
        "Used memory of a MIG device in bytes.",
        mig_labels,
    );
    let mut idx = itoa::Buffer::new();
    for g in &r.gpus {
        let id = &g.identity;
        let gpu = idx.format(id.index).to_string();
        let l = [gpu.as_str(), id.uuid.as_str()];
        info.add(&[&gpu, &id.uuid, &id.name, &id.pci_bus_id, driver], 1.0);
        up.add(&l, if g.state == GpuState::Ok { 1.0 } else { 0.0 });
        if let Some(m) = g.memory {
            total.add(&l, m.total as f64);
            used.add(&l, m.used as f64);
            free.add(&l, m.free as f64);
            // A unified GPU has no reserved figure: NVML gives no frame-buffer view of it.
            if g.unified.is_none() {
                reserved.add(&l, m.reserved as f64);
            }
        }
        if let Some(v) = g.utilization {
            util.add(&l, v);
        }
        if let Some(v) = g.temperature_celsius {
            temp.add(&l, v);
        }
        if let Some(v) = g.power_watts {
            power.add(&l, v);
        }
        for m in &g.mig_devices {
            let gi = m.gpu_instance_id.map(|v| v.to_string()).unwrap_or_default();
            let ci = m
                .compute_instance_id
                .map(|v| v.to_string())
                .unwrap_or_default();
            let ml = [gpu.as_str(), id.uuid.as_str(), m.uuid.as_str(), &gi, &ci];
            if let Some(mem) = m.memory {
                mig_total.add(&ml, mem.total as f64);
                mig_used.add(&ml, mem.used as f64);
            }
        }
    }
    for f in [
        info, up, total, used, free, reserved, util, temp, power, mig_total, mig_used,
    ] {
        f.finish(out);
    }
}

fn process_series(r: &NodeReading, out: &mut String) {
    let mut used = Family::gauge(
        "gpumon_process_memory_used_bytes",
        "GPU memory used by a process in bytes (NVML); absent when NVML reports it as not available.",
        PROC,
    );
    let mut info = Family::gauge(
        "gpumon_process_info",
        "GPU process identity; always 1.",
        &[
            "gpu",
            "uuid",
            "pid",
            "process",
            "container",
            "user",
            "kind",
            "mig_uuid",
            "namespace",
            "pod",
            "container_name",
        ],
    );
    let mut gbuf = itoa::Buffer::new();
    let mut pbuf = itoa::Buffer::new();
    for p in &r.processes {
        let gpu = gbuf.format(p.gpu);
        let pid = pbuf.format(p.pid);
        let name = p.info.name.as_deref().unwrap_or("");
        let container = p.info.container.as_deref().unwrap_or("");
        // Pod name (or UID until the kubelet names it) and namespace: empty outside Kubernetes.
        let ns = p.info.namespace.as_deref().unwrap_or("");
        let pod = p.info.pod.as_deref().unwrap_or("");
        let container_name = p.info.container_name.as_deref().unwrap_or("");
        if let Some(b) = p.used_memory_bytes {
            used.add(&[gpu, &p.uuid, pid, name, container, ns, pod], b as f64);
        }
        let kind = p.kind.as_str();
        let user = p.info.user.as_deref().unwrap_or("");
        let mig = p.mig_uuid.as_deref().unwrap_or("");
        info.add(
            &[
                gpu,
                &p.uuid,
                pid,
                name,
                container,
                user,
                kind,
                mig,
                ns,
                pod,
                container_name,
            ],
            1.0,
        );
    }
    used.finish(out);
    info.finish(out);
}

/// /metrics: the latest view's two texts plus the daemon's own counters (each part's `Health`,
/// in the order the daemon registered them).
///
/// The gzip form of the NVML text is made as each collection's view arrives (while scrapes ask
/// for gzip, `GZIP_AHEAD_FOR`) and kept until the next; the rest is compressed per scrape (it
/// is small).
pub struct Exporter {
    registry: Registry,
    views: watch::Receiver<Arc<View>>,
    health: Vec<Arc<dyn Health + Send + Sync>>,
    gzip: Mutex<Option<(u64, Arc<GzPrefix>)>>,
    /// When a scrape last asked for gzip (unix seconds): collections are compressed ahead only
    /// while someone scrapes that way.
    gzip_asked: std::sync::atomic::AtomicU64,
}

impl Exporter {
    pub fn new(
        views: watch::Receiver<Arc<View>>,
        health: Vec<Arc<dyn Health + Send + Sync>>,
    ) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let build = prometheus::GaugeVec::new(
            prometheus::Opts::new("gpumon_build_info", "gpumon build; always 1."),
            &["version", "revision"],
        )?;
        build
            .with_label_values(&[env!("CARGO_PKG_VERSION"), env!("GPUMON_REVISION")])
            .set(1.0);
        registry.register(Box::new(build))?;
        Ok(Self {
            registry,
            views,
            health,
            gzip: Mutex::new(None),
            gzip_asked: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// An exporter of one store as it is now, for tests and `benches/render.rs` (the daemon's
    /// exporter reads the aggregator's views): the view the aggregator would publish for it.
    pub fn of_store(
        store: &Store,
        health: Vec<Arc<dyn Health + Send + Sync>>,
    ) -> Result<Self, prometheus::Error> {
        let view = View::of(
            store,
            Arc::from(gpu_text(&store.nvml, store.latest())),
            Arc::from(trainer_text(store)),
            0,
        );
        Self::new(watch::channel(Arc::new(view)).1, health)
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn render(&self) -> String {
        let view = self.views.borrow().clone();
        let live = self.live_text(&view);
        let mut out = String::with_capacity(view.gpu_text.len() + live.len());
        out.push_str(&view.gpu_text);
        out.push_str(&live);
        out
    }

    /// `render()`'s text as one gzip member; the NVML part is compressed once per collection.
    pub fn render_gzip(&self) -> std::io::Result<Vec<u8>> {
        self.gzip_asked
            .store(crate::core::model::now() as u64, Ordering::Relaxed);
        let view = self.views.borrow().clone();
        let prefix = self.gpu_gzip(&view)?;
        prefix.with_tail(self.live_text(&view).as_bytes())
    }

    /// What is not the NVML text: the view's trainer text and the counters read now.
    fn live_text(&self, view: &View) -> String {
        let mut live = String::new();
        for part in &self.health {
            part.families(&mut live);
        }
        let mut out = String::with_capacity(view.trainer_text.len() + 8192);
        out.push_str(&view.trainer_text);
        out.push_str(&live);
        out.push_str(&encode(&self.registry.gather()));
        out
    }

    /// Deflates each collection's NVML text as it arrives, off the scrape's path, so the first
    /// scrape after a poll only compresses its small tail. Ends when the views end.
    pub async fn compress_each_collection(self: Arc<Self>) {
        let mut views = self.views.clone();
        while views.changed().await.is_ok() {
            let view = views.borrow_and_update().clone();
            let asked = self.gzip_asked.load(Ordering::Relaxed) as f64;
            if crate::core::model::now() - asked > GZIP_AHEAD_FOR {
                continue;
            }
            let done = {
                let cached = self.gzip.lock().unwrap_or_else(|p| p.into_inner());
                cached.as_ref().is_some_and(|(c, _)| *c == view.collection)
            };
            if done {
                continue;
            }
            let me = self.clone();
            // A failure here is a bug the scrape would meet and log itself.
            let _ = tokio::task::spawn_blocking(move || me.gpu_gzip(&view)).await;
        }
    }

    /// The NVML text deflated, made at the first call after each collection.
    fn gpu_gzip(&self, view: &View) -> std::io::Result<Arc<GzPrefix>> {
        let mut cache = self.gzip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((collection, gz)) = cache.as_ref() {
            if *collection == view.collection {
                return Ok(gz.clone());
            }
        }
        let gz = Arc::new(GzPrefix::new(view.gpu_text.as_bytes())?);
        // A newer collection's prefix, made meanwhile by a scrape, is not replaced by an older.
        if cache.as_ref().is_none_or(|(c, _)| *c < view.collection) {
            *cache = Some((view.collection, gz.clone()));
        }
        Ok(gz)
    }
}

/// The registry's families (gpumon_build_info) as text.
fn encode(families: &[MetricFamily]) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail on I/O; an error would mean a malformed family, which
    // the registry never gathers.
    if let Err(e) = TextEncoder::new().encode_utf8(families, &mut out) {
        tracing::error!(error = %e, "encoding metrics failed");
    }
    out
}

#[cfg(test)]
mod tests;
