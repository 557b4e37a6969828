//! `[kubernetes]`: where the kubelet's pods API is and how to trust it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::util::expand::expand;

/// Pod and namespace names for GPU processes, from the kubelet's pods API. Off unless
/// `kubelet_url` is set: GPU processes in pods then carry their pod UID alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// The kubelet's base URL, e.g. "https://${NODE_IP}:10250"; `${NAME}` is read from the
    /// environment when the daemon starts (the DaemonSet sets NODE_IP from status.hostIP).
    pub kubelet_url: Option<String>,
    /// A bearer token for the kubelet, read again at every request (projected tokens rotate).
    pub token_file: PathBuf,
    /// CA bundle that verifies the kubelet's serving certificate.
    pub ca_file: PathBuf,
    /// Skip verifying the kubelet's certificate (a self-signed one, kubeadm's default).
    pub insecure_skip_verify: bool,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        let sa = Path::new("/var/run/secrets/kubernetes.io/serviceaccount");
        Self {
            kubelet_url: None,
            token_file: sa.join("token"),
            ca_file: sa.join("ca.crt"),
            insecure_skip_verify: false,
        }
    }
}

/// A `kubelet_url` that can never name the kubelet, whatever the environment holds.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid {key} = {value:?}: {reason}")]
pub struct InvalidKubernetes {
    pub key: &'static str,
    pub value: String,
    pub reason: String,
}

impl KubernetesConfig {
    pub fn validate(&self) -> Result<(), InvalidKubernetes> {
        let Some(url) = &self.kubelet_url else {
            return Ok(());
        };
        // Only the form is checked here; the variables are read when the daemon starts.
        let reason = match expand(url, |_| Some("host".into())) {
            Err(reason) => reason,
            Ok(u) if !(u.starts_with("https://") || u.starts_with("http://")) => {
                "use the kubelet's https:// URL, e.g. \"https://${NODE_IP}:10250\"".into()
            }
            Ok(_) => return Ok(()),
        };
        Err(InvalidKubernetes {
            key: "kubernetes.kubelet_url",
            value: url.clone(),
            reason,
        })
    }
}
