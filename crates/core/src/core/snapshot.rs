//! The JSON API's document: everything the daemon knows right now. `gpumon status` and the TUI
//! read it back, so it is one owned type that both serialises and deserialises.

use crate::core::categories::{BatchFit, Split};
use std::collections::HashMap;

use serde::{Deserialize, Serialize, Serializer};

pub mod cursor;
pub mod jobs;
pub mod kept;
use cursor::Cursor;

use crate::core::detect::attribution::Attribution;
use crate::core::detect::orphan::HostPids;
use crate::core::detect::Finding;
use crate::core::jobs::JobView;
use crate::core::model::{GpuReading, ProcessReading, Timestamp};
use crate::core::store::chunks::{millis, seconds};
pub use crate::core::store::sessions::ooms::{OomRecord, Ooms};
use crate::core::store::sessions::Armed;
use crate::core::store::sessions::Session;
use crate::core::store::{GpuPoint, NvmlStatus, Point, Series, Store};
use crate::core::trainer::Stats;
use crate::core::trainer::{Ending, EventRecord, SessionPoint};

/// Serialised through `SnapshotOut`, which puts each session's OOMs into its entry.
#[derive(Debug, Clone, Deserialize)]
pub struct Snapshot {
    pub version: String,
    pub hostname: String,
    pub ts: Timestamp,
    pub nvml: NvmlView,
    /// Whether the daemon can tell that a GPU process has exited (orphaned_memory): `hidden` in
    /// a container without hostPID, where /proc holds none of NVML's pids; absent before NVML
    /// listed a process.
    #[serde(default)]
    pub host_pids: Option<HostPids>,
    pub gpus: Vec<GpuView>,
    pub processes: Vec<ProcessView>,
    /// Trainer sessions: live ones, then recently ended ones.
    #[serde(default)]
    pub sessions: Vec<SessionView>,
    /// Firing and recently resolved findings (filled by detection).
    #[serde(default)]
    pub findings: Vec<Finding>,
    /// The sessions of each run, judged as one (jobs.md).
    #[serde(default)]
    pub jobs: Vec<JobView>,
    /// Health of the trainer socket; absent where there is no ingest (e.g. `status --direct`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingest: Option<IngestView>,
    /// Each session's OOMs, in the order of `sessions`: written into that session's entry
    /// (`ooms`, `ooms_omitted`), without `explanation` (`/api/v1/sessions/{id}` has it). Not
    /// read back: the findings carry the newest explanation.
    #[serde(skip)]
    pub session_ooms: Vec<Ooms>,
    /// For the next request's `since=`: written when this one had `since` (cursor.rs).
    #[serde(default)]
    pub cursor: Option<String>,
    /// The request's cursor was honoured: each GPU's `history` holds only its points after the
    /// cursor's answer, each session's `series` only its points after the `samples` the cursor
    /// counted (newest `SESSION_POINTS`), and `processes_kept` says whose processes are left
    /// out. False: everything is whole.
    #[serde(default)]
    pub delta: bool,
    /// In a delta: GPUs (NVML index) whose processes are as in the cursor's answer, and not
    /// repeated in `processes` (kept.rs).
    #[serde(default)]
    pub processes_kept: Vec<u32>,
}

/// The snapshot as the API writes it: the same fields, in the same order, each session's
/// entry with its OOMs.
#[derive(Serialize)]
struct SnapshotOut<'a> {
    version: &'a str,
    hostname: &'a str,
    ts: Timestamp,
    nvml: &'a NvmlView,
    #[serde(skip_serializing_if = "Option::is_none")]
    host_pids: Option<HostPids>,
    gpus: &'a [GpuView],
    processes: &'a [ProcessView],
    sessions: Vec<SessionDoc<'a>>,
    findings: &'a [Finding],
    jobs: &'a [JobView],
    #[serde(skip_serializing_if = "Option::is_none")]
    ingest: Option<&'a IngestView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cursor: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<bool>,
    #[serde(skip_serializing_if = "<[u32]>::is_empty")]
    processes_kept: &'a [u32],
}

impl Serialize for Snapshot {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let none = Ooms::default();
        SnapshotOut {
            version: &self.version,
            hostname: &self.hostname,
            ts: self.ts,
            nvml: &self.nvml,
            host_pids: self.host_pids,
            gpus: &self.gpus,
            processes: &self.processes,
            sessions: self
                .sessions
                .iter()
                .enumerate()
                .map(|(i, view)| SessionDoc {
                    view,
                    ooms: self.session_ooms.get(i).unwrap_or(&none),
                })
                .collect(),
            findings: &self.findings,
            jobs: &self.jobs,
            ingest: self.ingest.as_ref(),
            cursor: self.cursor.as_deref(),
            // Only beside a cursor: answers without `since` keep their shape.
            delta: self.cursor.as_ref().map(|_| self.delta),
            processes_kept: &self.processes_kept,
        }
        .serialize(s)
    }
}

/// A session's entry in the API (the snapshot's `sessions`, `/api/v1/sessions/{id}`): its view
/// and its OOMs, newest first (`ooms`), with the count of older ones (`ooms_omitted`).
#[derive(Serialize)]
pub struct SessionDoc<'a> {
    #[serde(flatten)]
    pub view: &'a SessionView,
    #[serde(flatten)]
    pub ooms: &'a Ooms,
}

/// One session's entry, owned: what `/api/v1/sessions/{id}` copies out of the aggregator.
#[derive(Debug, Clone)]
pub struct SessionEntry {
    pub view: SessionView,
    pub ooms: Ooms,
}

impl SessionEntry {
    /// A live or recently ended session, as in the snapshot's `sessions`.
    pub fn lookup(store: &Store, id: &str) -> Option<Self> {
        store.sessions.get(id).map(|s| Self {
            view: SessionView::of(s, store),
            ooms: s.oom_log.clone(),
        })
    }
}

impl Serialize for SessionEntry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        SessionDoc {
            view: &self.view,
            ooms: &self.ooms,
        }
        .serialize(s)
    }
}

/// The gpumon_ingest_* counters, for readers of the JSON API (the TUI header).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngestView {
    pub connections: u64,
    pub lines: u64,
    /// Lines and connections refused, all error codes together.
    pub rejected: u64,
    /// Replies not sent because the client was not reading.
    pub dropped: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NvmlView {
    pub up: bool,
    pub error: Option<String>,
    pub library: String,
    pub driver_version: Option<String>,
    pub last_poll_ts: Option<Timestamp>,
    pub last_poll_duration_seconds: f64,
    /// Set when the library is a fake NVML (crates/fake-nvml): its identity, e.g.
    /// "fake-nvml 0.1.0; pids: scenario". The GPUs and processes are a scenario's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GpuView {
    #[serde(flatten)]
    pub reading: GpuReading,
    /// Memory history, oldest first; `value: null` marks a missed poll.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Point<GpuPoint>>,
}

impl Snapshot {
    /// Builds the document; `history_seconds` of GPU history are included (0 for none).
    pub fn build(store: &Store, hostname: &str, history_seconds: f64) -> Self {
        Self::build_since(store, hostname, history_seconds, None)
    }

    /// As `build`; with `since` (a cursor, or empty for none yet) it writes a cursor, and
    /// sends only the history after the one given when this daemon wrote it.
    pub fn build_since(
        store: &Store,
        hostname: &str,
        history_seconds: f64,
        since: Option<&str>,
    ) -> Self {
        let after = since.and_then(Cursor::parse);
        let latest = store.latest();
        let now = crate::core::model::now();
        let gpus: Vec<GpuView> = latest
            .map(|r| {
                r.gpus
                    .iter()
                    .map(|g| GpuView {
                        reading: g.clone(),
                        history: match store.gpu_series(&g.identity.uuid) {
                            Some(s) if history_seconds > 0.0 => {
                                gpu_history(s, now - history_seconds, after.as_ref())
                            }
                            _ => Vec::new(),
                        },
                    })
                    .collect()
            })
            .unwrap_or_default();
        let sessions: Vec<SessionView> = store
            .sessions
            .live()
            .chain(store.sessions.ended())
            .map(|sess| {
                let held = after
                    .as_ref()
                    .and_then(|c| Some(c.samples(cursor::session_key(&sess.id)?)))
                    .unwrap_or(0);
                SessionView::of_after(sess, store, held)
            })
            .collect();
        // By pid: scanning every session for each of 1,000 processes was most of a build.
        let mut live: HashMap<u32, Vec<&Session>> = HashMap::new();
        for s in store.sessions.live() {
            live.entry(s.peer.pid).or_default().push(s);
        }
        // Hashed as rows, and made views only for the GPUs sent: a delta answer usually keeps
        // most of a thousand processes, and copying each into a view to drop it again was a
        // tenth of the answer's cost.
        let rows: Vec<kept::Row> = latest
            .map(|r| {
                r.processes
                    .iter()
                    .map(|p| kept::Row::of(p, &live, &store.orphans))
                    .collect()
            })
            .unwrap_or_default();
        let hashes = since.and_then(|_| kept::hashes(&rows)).unwrap_or_default();
        let processes_kept = match &after {
            Some(c) => kept::kept(&hashes, c),
            None => Vec::new(),
        };
        let processes: Vec<ProcessView> = rows
            .iter()
            .filter(|r| processes_kept.binary_search(&r.reading.gpu).is_err())
            .map(ProcessView::of)
            .collect();
        let cursor = since.map(|_| {
            let gpu_ms = latest
                .into_iter()
                .flat_map(|r| &r.gpus)
                .filter_map(|g| store.gpu_series(&g.identity.uuid)?.last())
                .map(|p| millis(p.ts))
                .max()
                .unwrap_or(0);
            let counts = sessions
                .iter()
                .filter_map(|s| Some((cursor::session_key(&s.session)?, s.samples)))
                .collect();
            Cursor::write(gpu_ms, &hashes, counts)
        });
        let NvmlStatus {
            up,
            error,
            library,
            last_poll_ts,
            last_poll_duration_seconds,
            simulated,
            ..
        } = store.nvml.clone();
        Self {
            version: env!("CARGO_PKG_VERSION").to_string(),
            hostname: hostname.to_string(),
            ts: now,
            nvml: NvmlView {
                up,
                error,
                library,
                driver_version: latest.and_then(|r| r.driver_version.clone()),
                last_poll_ts,
                last_poll_duration_seconds,
                simulated,
            },
            host_pids: store.orphans.host_pids(),
            gpus,
            processes,
            sessions,
            findings: findings(store),
            jobs: jobs::views(store, hostname),
            ingest: None,
            session_ooms: store
                .sessions
                .live()
                .chain(store.sessions.ended())
                // Summaries only: the whole explanation is in /api/v1/sessions/{id} and in the
                // oom finding's evidence, not copied once more per session per snapshot.
                .map(|sess| sess.oom_log.summaries())
                .collect(),
            delta: after.is_some(),
            cursor,
            processes_kept,
        }
    }
}

/// A GPU's history from `start`; after a cursor, only its points newer than the cursor's.
fn gpu_history(s: &Series, start: Timestamp, after: Option<&Cursor>) -> Vec<Point<GpuPoint>> {
    let Some(c) = after else {
        return s.since(start).collect();
    };
    // The newest point is at hand; reading for older ones decodes the whole series.
    if s.last().is_none_or(|p| millis(p.ts) <= c.gpu_ms) {
        return Vec::new();
    }
    s.since(start.max(seconds(c.gpu_ms + 1))).collect()
}

/// Pending and firing findings of live sessions, held crashes, orphaned memory, then recently
/// resolved ones, each with the NVML index of its GPU (MIG-aware) when known.
fn findings(store: &Store) -> Vec<Finding> {
    let s = &store.sessions;
    s.live()
        .flat_map(|x| x.detect.current())
        .chain(s.findings.held())
        .chain(store.orphans.current())
        .chain(s.findings.recent().rev())
        .map(|f| {
            let mut f = f.clone();
            store.resolve_gpu(&mut f);
            f
        })
        .collect()
}

/// Points of session history the snapshot carries (the TUI's chart window).
pub const SESSION_POINTS: usize = 300;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionView {
    pub session: String,
    /// Host pid, from the kernel (SO_PEERCRED): the pid NVML reports.
    pub pid: u32,
    /// The pid the trainer sees itself as (differs inside a container).
    pub ns_pid: Option<u64>,
    pub uid: u32,
    pub job: Option<String>,
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub gpu_uuid: Option<String>,
    /// NVML index of that GPU, when NVML lists it.
    pub gpu: Option<u32>,
    /// This session's entry in NVML's process list, joined on (host pid, GPU UUID).
    #[serde(default)]
    pub nvml: Option<SessionNvml>,
    /// NVML's figure for the process split into live tensors, the allocator's cache and what
    /// lies outside the allocator (live sessions only).
    #[serde(default)]
    pub ledger: Option<crate::core::ledger::Ledger>,
    pub torch: Option<String>,
    pub client: Option<String>,
    pub started: Timestamp,
    pub samples: u64,
    pub last_sample_ts: Option<Timestamp>,
    pub step: Option<u64>,
    pub phase: Option<String>,
    pub stats: Option<Stats>,
    pub device_free: Option<u64>,
    pub device_total: Option<u64>,
    /// The caching allocator's cap (`set_per_process_memory_fraction`) the trainer last
    /// reported; detection measures headroom against it.
    #[serde(default)]
    pub alloc_limit: Option<u64>,
    pub alloc_retries_total: u64,
    pub ooms_total: u64,
    pub ended: Option<(Timestamp, Ending)>,
    pub events: Vec<EventRecord>,
    /// Recent step-boundary points, oldest first.
    pub series: Vec<Point<SessionPoint>>,
    /// The latest attribution the trainer sent: where its growing memory was allocated, with
    /// each site's stack, or its error answer (why there are no sites). A site's share of the
    /// growth is not repeated here: it is `bytes / max(total_growth_bytes, sum of sites' bytes)`.
    #[serde(default)]
    pub attribution: Option<Attribution>,
    /// The arming in force: the trainer was asked to keep allocation history recording while
    /// an OOM is likely (null when not armed).
    #[serde(default)]
    pub armed: Option<Armed>,
    /// Where the memory went at the latest measured step (docs/categories.md), with
    /// `other_bytes`, the step peak less everything named; null before a split arrived.
    #[serde(default)]
    pub categories: Option<Split>,
    /// The largest batch whose step peak the split predicts under the limit; null when unknown.
    #[serde(default)]
    pub largest_safe_batch: Option<u64>,
    /// How that batch was predicted: one batch size scaled in proportion, or a line fitted
    /// through several, with its error; the limit and margin it was held under.
    #[serde(default)]
    pub batch_fit: Option<BatchFit>,
}

/// What NVML and /proc say about a trainer's process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionNvml {
    pub used_memory_bytes: Option<u64>,
    pub process: Option<String>,
    pub user: Option<String>,
    pub container: Option<String>,
    /// The Kubernetes pod's name (its UID until the kubelet names it) and namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A GPU process, with the trainer session that runs in it when there is one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessView {
    #[serde(flatten)]
    pub reading: ProcessReading,
    /// The live trainer session of this (pid, GPU), if instrumented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The pid the trainer sees itself as (from its hello), inside its container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u64>,
    /// The process has exited and NVML still lists its memory: its orphaned_memory finding
    /// fires (`state` says zombie or gone).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub orphaned: bool,
}

/// Readers (status, TUI) use a process view as the reading it wraps.
impl std::ops::Deref for ProcessView {
    type Target = ProcessReading;
    fn deref(&self) -> &ProcessReading {
        &self.reading
    }
}

impl ProcessView {
    /// The view of a row. Every field is named here, so a field added to the view does not
    /// build until `kept::Row` (and so the delta's hash) carries it too.
    pub fn of(row: &kept::Row) -> Self {
        Self {
            reading: row.reading.clone(),
            session: row.session.map(str::to_string),
            ns_pid: row.ns_pid,
            orphaned: row.orphaned,
        }
    }
}

use crate::core::store::sessions::nvml::joins;

impl SessionView {
    /// One session, live or recently ended, as it appears in the snapshot's `sessions`.
    pub fn lookup(store: &Store, id: &str) -> Option<Self> {
        store.sessions.get(id).map(|s| Self::of(s, store))
    }

    fn of(s: &Session, store: &Store) -> Self {
        Self::of_after(s, store, 0)
    }

    /// With the series' points after the first `held` (all of them for 0).
    fn of_after(s: &Session, store: &Store, held: u64) -> Self {
        // `samples` counts every point the series took, so the new ones are the newest.
        let points = match held {
            0 => SESSION_POINTS,
            _ => (s.samples.saturating_sub(held) as usize).min(SESSION_POINTS),
        };
        let process = store.process_of(s);
        let ledger = ledger_with(s, store, process.entry);
        let nvml = process.info.map(|info| SessionNvml {
            used_memory_bytes: process.entry.and_then(|p| p.used_memory_bytes),
            process: info.name.clone(),
            user: info.user.clone(),
            container: info.container.clone(),
            pod: info.pod.clone(),
            namespace: info.namespace.clone(),
        });
        let last = s.last_sample.as_ref().map(|(_, x)| x);
        let batch_fit = s.batch_fit();
        Self {
            session: s.id.clone(),
            pid: s.peer.pid,
            ns_pid: s.hello.ns_pid,
            uid: s.peer.uid,
            job: s.hello.job.clone(),
            rank: s.hello.rank,
            world_size: s.hello.world_size,
            gpu_uuid: s.hello.gpu_uuid.clone(),
            // MIG-aware, the one lookup every output uses.
            gpu: s.hello.gpu_uuid.as_deref().and_then(|u| store.gpu_index(u)),
            nvml,
            ledger,
            torch: s.hello.torch.clone(),
            client: s.hello.client.clone(),
            started: s.started,
            samples: s.samples,
            last_sample_ts: s.last_sample.as_ref().map(|(t, _)| *t),
            step: last.and_then(|x| x.step),
            phase: last.map(|x| x.phase.as_str().to_string()),
            stats: last.map(|x| x.stats),
            device_free: last.and_then(|x| x.device_free),
            device_total: last.and_then(|x| x.device_total),
            alloc_limit: s.alloc_limit,
            alloc_retries_total: s.retries.total,
            ooms_total: s.ooms.total,
            ended: s.ended,
            events: s.events.iter().cloned().collect(),
            series: s.series.newest(points).collect(),
            attribution: s.attribution.clone(),
            armed: s.arming.armed().cloned(),
            categories: s.categories.latest().cloned(),
            largest_safe_batch: batch_fit.as_ref().map(|f| f.largest_safe_batch),
            batch_fit,
        }
    }
}

/// A live session's ledger: NVML's figure for its process on its GPU, accounted (ledger.rs).
pub fn session_ledger(s: &Session, store: &Store) -> Option<crate::core::ledger::Ledger> {
    ledger_with(s, store, store.process_of(s).entry)
}

/// The ledger of `s`, whose NVML entry (`process`) was looked up already.
fn ledger_with(
    s: &Session,
    store: &Store,
    process: Option<&ProcessReading>,
) -> Option<crate::core::ledger::Ledger> {
    if s.ended.is_some() {
        return None;
    }
    Some(crate::core::ledger::ledger(&crate::core::ledger::Inputs {
        nvml_used: process.and_then(|p| p.used_memory_bytes),
        poll_ts: store.latest().map(|r| r.ts),
        stats: s.last_sample.as_ref().map(|(_, x)| &x.stats),
        sample_ts: s.last_sample.as_ref().map(|(t, _)| *t),
        sessions_sharing: process
            .map_or(1, |p| store.sessions.live().filter(|o| joins(o, p)).count()),
    }))
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
