//! Reloading: the file is looked at as connections arrive and on SIGHUP.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{WebConfig, WebConfigError};

/// The config in force, reloaded when its file changes (looked at, at most once a second, as
/// connections arrive) or on SIGHUP. A file that fails to load keeps the one in force, and the
/// error is logged once per change of the file.
pub struct WebConfigWatch {
    path: Option<PathBuf>,
    state: Mutex<WatchState>,
}

struct WatchState {
    current: Arc<WebConfig>,
    seen: Option<(std::time::SystemTime, u64)>,
    checked: std::time::Instant,
}

impl WebConfigWatch {
    /// Loads `path` (an error here stops the daemon from starting); None: plain HTTP.
    pub fn new(path: Option<PathBuf>) -> Result<Self, WebConfigError> {
        let current = match &path {
            Some(p) => WebConfig::load(p)?,
            None => WebConfig::plain(),
        };
        let seen = path.as_deref().and_then(stamp);
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
                let now = stamp(path);
                if now != st.seen {
                    st.seen = now;
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
            st.seen = stamp(path);
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
}

fn stamp(path: &Path) -> Option<(std::time::SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}
