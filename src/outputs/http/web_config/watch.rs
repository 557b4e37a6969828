//! Reloading: the file and the certificate files it names are looked at as connections arrive,
//! and read again on SIGHUP.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{WebConfig, WebConfigError};

/// The config in force, reloaded when its file or a file it names (certificate, key, client CA)
/// changes (looked at, at most once a second, as connections arrive) or on SIGHUP. A config that
/// fails to load keeps the one in force, and the error is logged once per change of the files.
pub struct WebConfigWatch {
    path: Option<PathBuf>,
    state: Mutex<WatchState>,
}

struct WatchState {
    current: Arc<WebConfig>,
    /// The config file's stamp, then each of `current.files`'.
    seen: Vec<Stamp>,
    checked: std::time::Instant,
}

impl WebConfigWatch {
    /// Loads `path` (an error here stops the daemon from starting); None: plain HTTP.
    pub fn new(path: Option<PathBuf>) -> Result<Self, WebConfigError> {
        let current = match &path {
            Some(p) => WebConfig::load(p)?,
            None => WebConfig::plain(),
        };
        let seen = path
            .as_deref()
            .map(|p| stamps(p, &current))
            .unwrap_or_default();
        Ok(Self {
            path,
            state: Mutex::new(WatchState {
                current: Arc::new(current),
                seen,
                checked: std::time::Instant::now(),
            }),
        })
    }

    pub fn current(&self) -> Arc<WebConfig> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = &self.path {
            if st.checked.elapsed() >= Duration::from_secs(1) {
                st.checked = std::time::Instant::now();
                if stamps(path, &st.current) != st.seen {
                    reload(path, &mut st);
                }
            }
        }
        st.current.clone()
    }

    /// SIGHUP: read the file again now.
    pub fn reload(&self) {
        if let Some(path) = &self.path {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            reload(path, &mut st);
        }
    }
}

fn reload(path: &Path, st: &mut WatchState) {
    match WebConfig::load(path) {
        Ok(c) => {
            tracing::info!(file = %path.display(), tls = c.tls.is_some(), basic_auth = c.auth.enabled(), "web config reloaded");
            st.current = Arc::new(c);
        }
        Err(e) => tracing::error!(error = %e, "web config not reloaded; the one in force stays"),
    }
    // Stamped after the load, against the files the config in force names: a failed load is
    // tried again only when something changes again.
    st.seen = stamps(path, &st.current);
}

/// Modification time and size: what a rotation (a rename over the file, or a rewrite) changes.
type Stamp = Option<(std::time::SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn stamps(path: &Path, current: &WebConfig) -> Vec<Stamp> {
    std::iter::once(path)
        .chain(current.files.iter().map(PathBuf::as_path))
        .map(stamp)
        .collect()
}
