//! Reloading: a thread looks at the file and the certificate files it names once a second, and
//! SIGHUP reads them now. Either way the read is `reload::read_stable`'s: applied once the
//! files hold still, refused when broken or when it would take TLS or authentication away.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::reload::read_stable;
use super::stats::ReloadStats;
use super::{WebConfig, WebConfigError};

/// How often the files' stamps are compared with those of the last read.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The config in force, reloaded when its file or a file it names (certificate, key, client CA)
/// changes, or on SIGHUP. A reload that is refused keeps the config in force, is logged at
/// ERROR and counted, and is tried again only when the files change again (or on SIGHUP).
pub struct WebConfigWatch {
    inner: Arc<Inner>,
}

struct Inner {
    path: Option<PathBuf>,
    current: Mutex<Arc<WebConfig>>,
    /// The stamps of the last read (the config file's, then each of the files it names); held
    /// through a reload, so the watcher thread and SIGHUP never read at once.
    seen: Mutex<Vec<Stamp>>,
    stats: Arc<ReloadStats>,
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
        let inner = Arc::new(Inner {
            path,
            current: Mutex::new(Arc::new(current)),
            seen: Mutex::new(seen),
            stats: Arc::new(ReloadStats::loaded_now()),
        });
        if inner.path.is_some() {
            watch(Arc::downgrade(&inner));
        }
        Ok(Self { inner })
    }

    pub fn current(&self) -> Arc<WebConfig> {
        self.inner.current()
    }

    /// SIGHUP: read the files again now. Blocks while they settle (a fraction of a second, a
    /// few while a writer is still writing): call it off the async workers.
    pub fn reload(&self) {
        let mut seen = lock(&self.inner.seen);
        self.inner.reload(&mut seen);
    }

    /// How reloads went; None without a web config file (nothing is ever reloaded).
    pub fn reload_stats(&self) -> Option<Arc<ReloadStats>> {
        self.inner.path.as_ref().map(|_| self.inner.stats.clone())
    }
}

/// Compares the stamps once a second until the watch is dropped.
fn watch(inner: Weak<Inner>) {
    let spawned = std::thread::Builder::new()
        .name("gpumon-webcfg".into())
        .spawn(move || loop {
            std::thread::sleep(CHECK_EVERY);
            let Some(inner) = inner.upgrade() else {
                return;
            };
            inner.check();
        });
    if let Err(e) = spawned {
        // The config in force stays; only SIGHUP reloads it.
        tracing::error!(error = %e, "cannot start the web config watcher thread: changes to the web config apply only on SIGHUP");
    }
}

impl Inner {
    fn current(&self) -> Arc<WebConfig> {
        lock(&self.current).clone()
    }

    fn check(&self) {
        let Some(path) = &self.path else { return };
        let mut seen = lock(&self.seen);
        if stamps(path, &self.current()) != *seen {
            self.reload(&mut seen);
        }
    }

    fn reload(&self, seen: &mut Vec<Stamp>) {
        let Some(path) = &self.path else { return };
        let current = self.current();
        let before = stamps(path, &current);
        match read_stable(path, &current) {
            Ok(c) => {
                tracing::info!(file = %path.display(), tls = c.tls.is_some(), client_certs = c.client_certs, basic_auth_users = c.auth.users(), "web config reloaded");
                *lock(&self.current) = Arc::new(c);
                self.stats.succeeded();
            }
            Err(why) => {
                tracing::error!(file = %path.display(), error = %why, "web config reload refused; the one in force stays");
                self.stats.failed();
            }
        }
        // What was read is what the files held when it settled; a change since (the config
        // file's stamp moved during the read) keeps the stamps from before, so it is read again.
        let after = stamps(path, &self.current());
        *seen = if after.first() == before.first() {
            after
        } else {
            before
        };
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
