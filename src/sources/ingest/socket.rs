//! Where the ingest socket lives and how it is opened: the protocol's default path rules,
//! mode 0660 with group `gpumon` when that group exists, and systemd socket activation
//! (LISTEN_FDS), so trainers keep their socket while the daemon restarts.

use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

pub const DEFAULT_PATH: &str = "/run/gpumon/ingest.sock";
/// First fd passed by systemd socket activation.
const SD_LISTEN_FDS_START: i32 = 3;

/// The socket path when none is configured: /run/gpumon when it can be created (root), else
/// $XDG_RUNTIME_DIR/gpumon. The `gpumon` directory of these default paths is created here; a
/// configured path's directory must exist (see `bind`).
pub fn default_path() -> Option<PathBuf> {
    if std::fs::create_dir_all("/run/gpumon").is_ok() {
        return Some(DEFAULT_PATH.into());
    }
    let xdg = std::env::var_os("XDG_RUNTIME_DIR")?;
    let dir = Path::new(&xdg).join("gpumon");
    // Failing here is reported by `bind`, which names the directory.
    let _ = std::fs::create_dir(&dir);
    Some(dir.join("ingest.sock"))
}

/// An inherited listener from systemd, when this process is the one it was meant for.
pub fn from_systemd() -> std::io::Result<Option<UnixListener>> {
    let pid_ok = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let fds = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(0);
    if !pid_ok || fds < 1 {
        return Ok(None);
    }
    // SAFETY: systemd passed fd 3 to this pid (checked above) and nothing else owns it.
    let std_listener =
        unsafe { std::os::unix::net::UnixListener::from_raw_fd(SD_LISTEN_FDS_START) };
    std_listener.set_nonblocking(true)?;
    Ok(Some(UnixListener::from_std(std_listener)?))
}

/// Why `bind` failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Only another path can fix it: the daemon treats it as a configuration error (EX_CONFIG).
    #[error("invalid socket = {:?}: {reason}", path.display().to_string())]
    Path { path: PathBuf, reason: String },
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Binds `path`: removes a stale socket left by a previous run (only a socket, never another
/// kind of file), then sets mode 0660 and group `gpumon` when it exists. The directory must
/// exist: creating a mistyped path's directories would leave trainers looking elsewhere, with
/// nothing said. Every error names the path.
pub fn bind(path: &Path) -> Result<UnixListener, BindError> {
    let invalid = |reason: String| BindError::Path {
        path: path.to_path_buf(),
        reason,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(invalid(format!(
                "the directory {} does not exist; create it, or fix --socket / GPUMON_SOCKET / socket = in the config",
                dir.display()
            )));
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if !meta.file_type().is_socket() {
            return Err(invalid(
                "it exists and is not a socket; remove it or choose another --socket".into(),
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(anyhow::anyhow!(
                "{} is in use by a running daemon; stop it or choose another --socket",
                path.display()
            )
            .into());
        }
        std::fs::remove_file(path).map_err(|e| {
            anyhow::anyhow!(
                "cannot remove the stale socket {} (owner uid {}, left by an earlier run): {e}; remove it as its owner or root, or choose another --socket",
                path.display(),
                meta.uid()
            )
        })?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot bind {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| anyhow::anyhow!("cannot set mode 0660 on {}: {e}", path.display()))?;
    if let Some(gid) = group_id("gpumon") {
        // None leaves the owner as it is.
        if let Err(e) = std::os::unix::fs::chown(path, None, Some(gid)) {
            tracing::warn!(path = %path.display(), error = %e, "cannot give the socket to group gpumon");
        }
    }
    Ok(listener)
}

/// The socket file this daemon bound, removed when this is dropped (a clean exit), so no stale
/// file is left for trainers to find. Only the file bound here: if something else has replaced
/// it since (same path, another inode), it is left alone.
pub struct SocketFile {
    path: PathBuf,
    id: Option<(u64, u64)>,
}

impl SocketFile {
    /// Takes ownership of the socket just bound at `path`.
    pub fn claim(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            id: file_id(path),
        }
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if self.id.is_some() && file_id(&self.path) == self.id {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(socket = %self.path.display(), "cannot remove the ingest socket: {e}");
            }
        }
    }
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn group_id(name: &str) -> Option<u32> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}

/// Whether a newline lies within the next `within` bytes queued on `fd`, peeked without taking
/// them (the socket is non-blocking; nothing queued is no). The copy is as long as the line can
/// still be, and only a connection that must wait for line buffer room pays it, once.
pub fn line_end_queued(fd: std::os::fd::RawFd, within: usize) -> bool {
    let mut buf = vec![0u8; within];
    // SAFETY: `buf` is valid for `within` bytes; MSG_PEEK leaves the data queued and
    // MSG_DONTWAIT never blocks. A closed or reused fd only gives a wrong yes/no.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast(),
            within,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).is_ok_and(|n| memchr::memchr(b'\n', &buf[..n.min(within)]).is_some())
}
