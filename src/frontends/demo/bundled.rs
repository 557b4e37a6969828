//! Finding the demo's fake NVML library: an explicit `--nvml-lib`, a copy installed beside the
//! binary or in the package's library directory, else the copy built into the binary (feature
//! `bundled-fake-nvml`), loaded from memory without writing a file.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The library's file name wherever it is installed.
pub const LIB_FILE: &str = "libfake_nvml.so";
/// Where the Debian package installs it.
pub const PACKAGE_DIR: &str = "/usr/lib/gpumon";

#[cfg(feature = "bundled-fake-nvml")]
static BUNDLED: &[u8] = include_bytes!(env!("GPUMON_BUNDLED_FAKE_NVML"));
#[cfg(not(feature = "bundled-fake-nvml"))]
static BUNDLED: &[u8] = &[];

/// The library to load, and what keeps it loadable until the demo ends.
pub struct FakeLib {
    pub path: PathBuf,
    /// Where it came from, for the log.
    pub origin: &'static str,
    /// The in-memory file behind `/proc/self/fd/N`: NVML may be re-initialised (and the path
    /// opened again) at any point while the demo runs.
    _memfd: Option<OwnedFd>,
}

/// Installed locations in the order tried: beside the binary (a workspace build), the package
/// layout relative to the binary (`/usr/bin` → `/usr/lib/gpumon`, also inside a scratch root or
/// another prefix), then the package's absolute directory.
pub fn candidates(exe: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = exe.parent() {
        out.push(dir.join(LIB_FILE));
        if let Some(prefix) = dir.parent() {
            out.push(prefix.join("lib/gpumon").join(LIB_FILE));
        }
    }
    let packaged = Path::new(PACKAGE_DIR).join(LIB_FILE);
    if !out.contains(&packaged) {
        out.push(packaged);
    }
    out
}

/// The explicit path, else the first installed copy, else the built-in one.
pub fn find(explicit: Option<&Path>, scratch: &Path) -> anyhow::Result<FakeLib> {
    if let Some(p) = explicit {
        if !p.is_file() {
            anyhow::bail!("--nvml-lib {}: no such file", p.display());
        }
        return Ok(installed(p.to_path_buf(), "--nvml-lib"));
    }
    let exe = std::env::current_exe()?;
    let tried = candidates(&exe);
    if let Some(p) = tried.iter().find(|p| p.is_file()) {
        return Ok(installed(p.clone(), "installed"));
    }
    if !BUNDLED.is_empty() {
        return load_bundled(scratch);
    }
    let list: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    anyhow::bail!(
        "the demo's simulated GPUs need the fake NVML library: this gpumon was built without it \
         (no default feature bundled-fake-nvml) and none is installed at {}; build the workspace \
         (`cargo build --workspace` puts it beside gpumon), install the .deb, or pass --nvml-lib PATH",
        list.join(", ")
    )
}

fn installed(path: PathBuf, origin: &'static str) -> FakeLib {
    FakeLib {
        path,
        origin,
        _memfd: None,
    }
}

/// The built-in copy in a memfd, opened as `/proc/self/fd/N`; where memfds or /proc are not
/// available, a file in the demo's scratch directory (removed when the demo ends).
fn load_bundled(scratch: &Path) -> anyhow::Result<FakeLib> {
    match memfd() {
        Ok(fd) => {
            let path = PathBuf::from(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ));
            if path.is_file() {
                return Ok(FakeLib {
                    path,
                    origin: "built into the binary",
                    _memfd: Some(fd),
                });
            }
        }
        Err(e) => tracing::debug!("memfd for the fake NVML library: {e}; using a file"),
    }
    std::fs::create_dir_all(scratch)?;
    let path = scratch.join(LIB_FILE);
    std::fs::write(&path, BUNDLED)?;
    Ok(FakeLib {
        path,
        origin: "built into the binary (unpacked)",
        _memfd: None,
    })
}

fn memfd() -> std::io::Result<OwnedFd> {
    // CLOEXEC: the demo's trainer children have no use for it.
    let fd = rustix::fs::memfd_create("libfake_nvml.so", rustix::fs::MemfdFlags::CLOEXEC)?;
    std::fs::File::from(fd.try_clone()?).write_all(BUNDLED)?;
    Ok(fd)
}

#[cfg(test)]
mod tests;
