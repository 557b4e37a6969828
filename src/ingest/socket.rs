//! Where the ingest socket lives and how it is opened: the protocol's default path rules,
//! mode 0660 with group `gpumon` when that group exists, and systemd socket activation
//! (LISTEN_FDS), so trainers keep their socket while the daemon restarts.

use std::ffi::CString;
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

pub const DEFAULT_PATH: &str = "/run/gpumon/ingest.sock";
/// First fd passed by systemd socket activation.
const SD_LISTEN_FDS_START: i32 = 3;

/// The socket path to create: the configured one, else /run/gpumon when it can be created
/// (root), else $XDG_RUNTIME_DIR/gpumon.
pub fn default_path() -> Option<PathBuf> {
    if std::fs::create_dir_all("/run/gpumon").is_ok() {
        return Some(DEFAULT_PATH.into());
    }
    let xdg = std::env::var_os("XDG_RUNTIME_DIR")?;
    Some(Path::new(&xdg).join("gpumon/ingest.sock"))
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

/// Binds `path`: removes a stale socket left by a previous run (only a socket, never another
/// kind of file), then sets mode 0660 and group `gpumon` when it exists.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot create {}: {e}; set --socket to a writable path",
                dir.display()
            )
        })?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "{} exists and is not a socket; remove it or choose another --socket",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "{} is in use by a running daemon; stop it or choose another --socket",
                path.display()
            );
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot bind {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    if let Some(gid) = group_id("gpumon") {
        if let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) {
            // SAFETY: valid C string; -1 leaves the owner unchanged.
            let rc = unsafe { libc::chown(c.as_ptr(), u32::MAX, gid) };
            if rc != 0 {
                tracing::warn!(path = %path.display(), "cannot give the socket to group gpumon");
            }
        }
    }
    Ok(listener)
}

fn group_id(name: &str) -> Option<u32> {
    let groups = std::fs::read_to_string("/etc/group").ok()?;
    groups.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.nth(1)?.parse().ok()
    })
}
