//! Pod and namespace names for GPU processes, from the kubelet's pods API.
//!
//! procinfo gives a process in a pod its pod UID and container id (the kubelet names the cgroup
//! after them); this adds the names people know them by, from `GET <kubelet>/pods`: the
//! kubelet's own list of the pods on this node, so no API-server load and no cluster-wide read.
//! The request runs on a thread of its own, never in the poll: when a pod or container not seen
//! before appears, at most every 30 s. Until the kubelet answers (or without `kubelet_url`) a
//! pod is labelled by its UID, and one log line says why.

use crate::util::backoff::Backoff;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::procinfo::kube_ids;
use super::{GpuSource, SourceError};
use crate::core::model::NodeReading;
use crate::util::expand::expand;

mod settings;
pub use settings::{InvalidKubernetes, KubernetesConfig};

/// Shortest time between two requests to the kubelet.
pub const MIN_REFRESH: Duration = Duration::from_secs(30);
/// Longest wait between attempts while the kubelet does not answer.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// A /pods response larger than this is refused (110 pods, the kubelet's default cap, take a
/// few MB even with large annotations).
pub const MAX_BODY_BYTES: u64 = 32 << 20;
/// Pods kept from one response at most.
pub const MAX_PODS: usize = 4096;
/// Pod UIDs and container ids remembered as asked for; past it the set starts again.
const MAX_SEEN: usize = 16_384;
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the kubelet says about one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    /// Container name by full container id (the part after `<runtime>://`).
    pub containers: HashMap<String, String>,
}

/// Pods by UID.
pub type PodIndex = HashMap<String, PodMeta>;

#[derive(Deserialize)]
struct PodList {
    // The kubelet writes `"items": null` when it runs no pods.
    #[serde(default)]
    items: Option<Vec<Pod>>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Meta,
    #[serde(default)]
    status: Option<Status>,
}

#[derive(Deserialize)]
struct Meta {
    uid: String,
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    container_statuses: Option<Vec<ContainerStatus>>,
    #[serde(default)]
    init_container_statuses: Option<Vec<ContainerStatus>>,
    #[serde(default)]
    ephemeral_container_statuses: Option<Vec<ContainerStatus>>,
}

#[derive(Deserialize)]
struct ContainerStatus {
    name: String,
    // Absent while the container is being created.
    #[serde(default, rename = "containerID")]
    container_id: Option<String>,
}

/// The pods in a kubelet `/pods` response (a v1 PodList), by UID.
pub fn parse_pods(body: &[u8]) -> Result<PodIndex, String> {
    let list: PodList = serde_json::from_slice(body).map_err(|e| format!("not a PodList ({e})"))?;
    let mut out = PodIndex::new();
    for pod in list.items.unwrap_or_default().into_iter().take(MAX_PODS) {
        let mut containers = HashMap::new();
        if let Some(st) = pod.status {
            let all = [
                st.container_statuses,
                st.init_container_statuses,
                st.ephemeral_container_statuses,
            ];
            for c in all.into_iter().flatten().flatten() {
                let id = c.container_id.as_deref().and_then(|i| i.split_once("://"));
                if let Some((_, id)) = id {
                    containers.insert(id.to_string(), c.name);
                }
            }
        }
        let meta = PodMeta {
            namespace: pod.metadata.namespace,
            name: pod.metadata.name,
            containers,
        };
        out.insert(pod.metadata.uid, meta);
    }
    Ok(out)
}

/// Fills `pod`, `namespace` and `container_name` of the processes whose pod `index` knows.
pub fn annotate(index: &PodIndex, reading: &mut NodeReading) {
    for p in &mut reading.processes {
        let Some(ids) = p.info.cgroup.as_deref().and_then(kube_ids) else {
            continue;
        };
        let Some(meta) = index.get(&ids.pod_uid) else {
            continue;
        };
        // A copy for annotated processes only; the rest keep sharing the cache's info.
        let info = std::sync::Arc::make_mut(&mut p.info);
        info.pod = Some(meta.name.clone());
        info.namespace = Some(meta.namespace.clone());
        info.container_name = ids
            .container_id
            .and_then(|id| meta.containers.get(&id).cloned());
    }
}

/// The kubelet's pods API, as configured.
pub struct Kubelet {
    pods_url: String,
    token_file: PathBuf,
    agent: ureq::Agent,
}

impl Kubelet {
    pub fn new(cfg: &KubernetesConfig, url: &str) -> Result<Self, String> {
        use ureq::tls::{PemItem, RootCerts, TlsConfig};
        let mut tls = TlsConfig::builder();
        if url.starts_with("https://") {
            if cfg.insecure_skip_verify {
                tls = tls.disable_verification(true);
            } else {
                let pem = std::fs::read(&cfg.ca_file)
                    .map_err(|e| format!("kubernetes.ca_file {}: {e}", cfg.ca_file.display()))?;
                let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                    .filter_map(|i| match i {
                        Ok(PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if certs.is_empty() {
                    return Err(format!(
                        "kubernetes.ca_file {}: holds no PEM certificate",
                        cfg.ca_file.display()
                    ));
                }
                tls = tls.root_certs(RootCerts::Specific(Arc::new(certs)));
            }
        }
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .tls_config(tls.build())
            .build()
            .new_agent();
        Ok(Self {
            pods_url: format!("{}/pods", url.trim_end_matches('/')),
            token_file: cfg.token_file.clone(),
            agent,
        })
    }

    /// One request. The error says what to fix and never holds the token.
    pub fn fetch(&self) -> Result<PodIndex, String> {
        let token = std::fs::read_to_string(&self.token_file).map_err(|e| {
            format!(
                "cannot read kubernetes.token_file {}: {e}",
                self.token_file.display()
            )
        })?;
        let mut resp = self
            .agent
            .get(&self.pods_url)
            .header("Authorization", format!("Bearer {}", token.trim()))
            .call()
            .map_err(|e| match e {
                ureq::Error::StatusCode(c @ (401 | 403)) => format!(
                    "{} answered {c}: the service account needs get on nodes/pods (nodes/proxy before Kubernetes 1.33)",
                    self.pods_url
                ),
                e @ (ureq::Error::Tls(_) | ureq::Error::Rustls(_)) => format!(
                    "{}: {e} (a self-signed kubelet certificate: turn on the kubelet's serverTLSBootstrap, or set kubernetes.insecure_skip_verify)",
                    self.pods_url
                ),
                e => format!("{}: {e}", self.pods_url),
            })?;
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_BODY_BYTES)
            .read_to_vec()
            .map_err(|e| format!("{}: {e}", self.pods_url))?;
        parse_pods(&body).map_err(|e| format!("{}: {e}", self.pods_url))
    }
}

/// What the poll and the refresh thread share.
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    index: Arc<PodIndex>,
    /// Pods (by container id, or UID without one) already asked about.
    seen: HashSet<String>,
    wanted: bool,
    stop: bool,
}

impl Shared {
    fn annotate(&self, reading: &mut NodeReading) {
        let index = {
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            for p in &reading.processes {
                let Some(ids) = p.info.cgroup.as_deref().and_then(kube_ids) else {
                    continue;
                };
                let known = st.index.get(&ids.pod_uid).is_some_and(|m| {
                    ids.container_id
                        .as_ref()
                        .is_none_or(|id| m.containers.contains_key(id))
                });
                if known {
                    continue;
                }
                if st.seen.len() >= MAX_SEEN {
                    st.seen.clear();
                }
                if st.seen.insert(ids.container_id.unwrap_or(ids.pod_uid)) {
                    st.wanted = true;
                    self.wake.notify_one();
                }
            }
            st.index.clone()
        };
        annotate(&index, reading);
    }

    fn stop(&self) {
        if let Ok(mut st) = self.state.lock() {
            st.stop = true;
        }
        self.wake.notify_one();
    }
}

/// Asks the kubelet when the poll wants it, at most every MIN_REFRESH (longer while it fails).
fn refresh_loop(shared: Arc<Shared>, kubelet: Kubelet) {
    let mut last: Option<Instant> = None;
    let mut gap = Backoff::new(MIN_REFRESH, MAX_BACKOFF);
    let mut failing: Option<String> = None;
    let mut named_once = false;
    loop {
        {
            let Ok(mut st) = shared.state.lock() else {
                return;
            };
            while !st.wanted && !st.stop {
                st = match shared.wake.wait(st) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            }
            if let Some(until) = last.map(|l| l + gap.current()) {
                while !st.stop {
                    let Some(left) = until.checked_duration_since(Instant::now()) else {
                        break;
                    };
                    st = match shared.wake.wait_timeout(st, left) {
                        Ok((s, _)) => s,
                        Err(_) => return,
                    };
                }
            }
            if st.stop {
                return;
            }
            st.wanted = false;
        }
        last = Some(Instant::now());
        let result = kubelet.fetch();
        let Ok(mut st) = shared.state.lock() else {
            return;
        };
        match result {
            Ok(index) => {
                if failing.take().is_some() || !named_once {
                    tracing::info!(pods = index.len(), "pod names from the kubelet");
                }
                named_once = true;
                gap.reset();
                st.index = Arc::new(index);
            }
            Err(e) => {
                gap.fail();
                let gap = gap.current();
                if failing.as_deref() != Some(e.as_str()) {
                    tracing::warn!(error = %e, retry_in = ?gap, "cannot read pod names from the kubelet: GPU processes in pods are labelled with their pod UID until it answers");
                } else {
                    tracing::debug!(error = %e, retry_in = ?gap, "kubelet still unreachable");
                }
                failing = Some(e);
                st.wanted = true;
            }
        }
    }
}

/// A GPU source whose processes in pods carry their pod's names.
pub struct Named {
    inner: Box<dyn GpuSource>,
    shared: Option<Arc<Shared>>,
    /// Why names are off, said once, at the first process seen in a pod.
    off: Option<String>,
}

impl Named {
    /// Wraps `inner`; starts the refresh thread when `cfg.kubelet_url` is set. Trouble with
    /// the settings is logged and leaves names off (the UIDs still label pods).
    pub fn new(inner: Box<dyn GpuSource>, cfg: &KubernetesConfig) -> Self {
        let started = match &cfg.kubelet_url {
            None => Err("kubernetes.kubelet_url is not set".to_string()),
            Some(url) => expand(url, |n| std::env::var(n).ok())
                .and_then(|u| Kubelet::new(cfg, &u))
                .and_then(|k| Self::spawn(k).map_err(|e| format!("cannot start a thread: {e}"))),
        };
        match started {
            Ok(shared) => Self {
                inner,
                shared: Some(shared),
                off: None,
            },
            Err(why) => Self {
                inner,
                shared: None,
                off: Some(why),
            },
        }
    }

    fn spawn(kubelet: Kubelet) -> std::io::Result<Arc<Shared>> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("gpumon-kubelet".into())
            .spawn(move || refresh_loop(s, kubelet))?;
        Ok(shared)
    }
}

impl GpuSource for Named {
    fn collect(&mut self) -> Result<NodeReading, SourceError> {
        let mut reading = self.inner.collect()?;
        match &self.shared {
            Some(s) => s.annotate(&mut reading),
            None => {
                if reading.processes.iter().any(|p| p.info.pod_uid.is_some()) {
                    if let Some(why) = self.off.take() {
                        tracing::info!("{why}: GPU processes in pods are labelled with their pod UID only, without namespace");
                    }
                }
            }
        }
        Ok(reading)
    }

    fn proc_view(&mut self) -> Option<crate::core::model::ProcView> {
        self.inner.proc_view()
    }

    fn simulated(&mut self) -> Option<String> {
        self.inner.simulated()
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.stop();
        }
    }
}

#[cfg(test)]
mod tests;
