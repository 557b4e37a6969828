//! Test support for other crates: build the fake library once per process and say where it is.
//!
//! ```no_run
//! let lib = fake_nvml::harness::library_path();            // for Nvml::builder().lib_path(..)
//! let dir = fake_nvml::harness::soname_dir();              // for LD_LIBRARY_PATH users
//! let scenario = fake_nvml::harness::scenario_path("two_gpus");
//! # let _ = (lib, dir, scenario);
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Set to use a prebuilt library instead of building one.
pub const ENV_LIB: &str = "FAKE_NVML_LIB";

/// File name of the built cdylib.
pub const LIB_FILE: &str = "libfake_nvml.so";

/// The name `dlopen` callers such as pynvml look for.
pub const SONAME: &str = "libnvidia-ml.so.1";

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped scenarios directory (`crates/fake-nvml/scenarios`).
pub fn scenarios_dir() -> PathBuf {
    manifest_dir().join("scenarios")
}

/// Path of a shipped scenario; `name` may omit the `.toml` extension. Panics, naming the
/// available scenarios, if it does not exist.
pub fn scenario_path(name: &str) -> PathBuf {
    let file = if name.ends_with(".toml") {
        name.to_owned()
    } else {
        format!("{name}.toml")
    };
    let path = scenarios_dir().join(file);
    if !path.is_file() {
        let available: Vec<String> = std::fs::read_dir(scenarios_dir())
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".toml"))
                    .collect()
            })
            .unwrap_or_default();
        panic!("fake-nvml: no scenario {name:?}; available: {available:?}");
    }
    path
}

/// Where cargo put the running test or bench binary: (target dir, optional `--target` triple,
/// profile directory name).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    target_dir: PathBuf,
    triple: Option<String>,
    profile_dir: String,
}

impl Layout {
    /// Test and bench binaries live in `<target>/[<triple>/]<profile>/deps/`; cargo marks
    /// `<target>` with CACHEDIR.TAG.
    fn from_exe(exe: &Path) -> Option<Layout> {
        let mut dir = exe.parent()?;
        if matches!(dir.file_name()?.to_str()?, "deps" | "examples") {
            dir = dir.parent()?;
        }
        let profile_dir = dir.file_name()?.to_str()?.to_owned();
        let up = dir.parent()?;
        if up.join("CACHEDIR.TAG").is_file() {
            return Some(Layout {
                target_dir: up.to_owned(),
                triple: None,
                profile_dir,
            });
        }
        let root = up.parent()?;
        if root.join("CACHEDIR.TAG").is_file() {
            let triple = up.file_name()?.to_str()?.to_owned();
            return Some(Layout {
                target_dir: root.to_owned(),
                triple: Some(triple),
                profile_dir,
            });
        }
        None
    }

    /// Outside a cargo target dir: `CARGO_TARGET_DIR`, else the workspace's `target`, debug.
    fn fallback() -> Layout {
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target"));
        Layout {
            target_dir,
            triple: None,
            profile_dir: "debug".into(),
        }
    }

    fn output_dir(&self) -> PathBuf {
        let mut p = self.target_dir.clone();
        if let Some(t) = &self.triple {
            p.push(t);
        }
        p.push(&self.profile_dir);
        p
    }

    fn profile_args(&self) -> Vec<String> {
        match self.profile_dir.as_str() {
            "debug" => vec![],
            "release" => vec!["--release".into()],
            other => vec!["--profile".into(), other.into()],
        }
    }
}

/// The workspace root: the crate lives at `<root>/crates/fake-nvml`.
fn workspace_root() -> PathBuf {
    let m = manifest_dir();
    m.parent().and_then(Path::parent).unwrap_or(m).to_owned()
}

fn layout() -> Layout {
    // An absolute CARGO_TARGET_DIR is used as given; otherwise the running binary's own target
    // dir, which is where cargo put it (and equals CARGO_TARGET_DIR when that was relative).
    let from_exe = std::env::current_exe()
        .ok()
        .and_then(|e| Layout::from_exe(&e));
    match (
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from),
        from_exe,
    ) {
        (Some(dir), Some(l)) if dir.is_absolute() => Layout {
            target_dir: dir,
            ..l
        },
        (Some(dir), None) if dir.is_absolute() => Layout {
            target_dir: dir,
            ..Layout::fallback()
        },
        (_, Some(l)) => l,
        (_, None) => Layout::fallback(),
    }
}

fn build() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(ENV_LIB) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{ENV_LIB}={} is not a file", p.display()))
        };
    }
    let layout = layout();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(workspace_root())
        .arg("build")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(manifest_dir().join("Cargo.toml"))
        .args(["-p", "fake-nvml", "--lib", "--target-dir"])
        .arg(&layout.target_dir)
        .args(layout.profile_args());
    if let Some(t) = &layout.triple {
        cmd.args(["--target", t]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!(
            "`{cmd:?}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let lib = layout.output_dir().join(LIB_FILE);
    if lib.is_file() {
        Ok(lib)
    } else {
        Err(format!(
            "cargo build succeeded but {} does not exist",
            lib.display()
        ))
    }
}

/// Builds the fake library (once per process, with the running binary's profile and target dir)
/// and returns its path, or why it could not.
pub fn try_library_path() -> Result<PathBuf, String> {
    static LIB: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    LIB.get_or_init(build).clone()
}

/// [`try_library_path`], panicking with the build error: for tests, where that is the report.
pub fn library_path() -> PathBuf {
    try_library_path().unwrap_or_else(|e| panic!("fake-nvml: cannot build the fake library: {e}"))
}

fn make_soname_dir() -> Result<PathBuf, String> {
    let lib = try_library_path()?;
    let lib = lib
        .canonicalize()
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    let dir = lib
        .parent()
        .ok_or_else(|| format!("{} has no parent", lib.display()))?
        .join("fake-nvml-soname");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // Several test processes may do this at once: make the link under a private name, then
    // rename it into place atomically.
    let tmp = dir.join(format!(".{SONAME}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&lib, &tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(SONAME)).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// A directory holding `libnvidia-ml.so.1` -> the fake library, for programs that `dlopen` NVML
/// by name: put it on `LD_LIBRARY_PATH`.
pub fn try_soname_dir() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(make_soname_dir).clone()
}

/// [`try_soname_dir`], panicking with the error.
pub fn soname_dir() -> PathBuf {
    try_soname_dir().unwrap_or_else(|e| panic!("fake-nvml: cannot make the soname directory: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_from_exe_paths() {
        let root = std::env::temp_dir().join(format!("fake-nvml-layout-{}", std::process::id()));
        std::fs::create_dir_all(root.join("x86_64-unknown-linux-gnu/release/deps")).unwrap();
        std::fs::create_dir_all(root.join("debug/deps")).unwrap();
        std::fs::write(root.join("CACHEDIR.TAG"), "").unwrap();
        let l = Layout::from_exe(&root.join("debug/deps/t-123")).unwrap();
        assert_eq!((l.triple, l.profile_dir.as_str()), (None, "debug"));
        assert_eq!(l.target_dir, root);
        let l = Layout::from_exe(&root.join("x86_64-unknown-linux-gnu/release/deps/b-1")).unwrap();
        assert_eq!(l.triple.as_deref(), Some("x86_64-unknown-linux-gnu"));
        assert_eq!(l.profile_args(), vec!["--release".to_string()]);
        assert_eq!(
            l.output_dir(),
            root.join("x86_64-unknown-linux-gnu/release")
        );
        assert_eq!(Layout::from_exe(Path::new("/usr/bin/true")), None);
        std::fs::remove_dir_all(root).unwrap();
    }
}
