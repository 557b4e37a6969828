//! Stamps the git revision into the binary for `gpumon_build_info`, and (feature
//! `bundled-fake-nvml`, on by default) builds the demo's fake NVML library so the binary can carry
//! it: `gpumon demo` then works from a lone binary (`cargo install`), with nothing beside it.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    stamp_revision();
    if env::var_os("CARGO_FEATURE_BUNDLED_FAKE_NVML").is_some() {
        bundle_fake_nvml();
    }
}

fn stamp_revision() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GPUMON_REVISION={rev}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
}

/// Builds crates/fake-nvml (release, stripped) with a nested cargo in its own target directory
/// under OUT_DIR, so it never waits on the outer build's lock, and points
/// GPUMON_BUNDLED_FAKE_NVML at a copy. Without the crate's sources (a packaged crate) the copy is
/// empty and the demo says where else it looked.
fn bundle_fake_nvml() {
    let root = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let dest = out.join("libfake_nvml.so");
    let crate_dir = root.join("crates/fake-nvml");
    println!(
        "cargo:rustc-env=GPUMON_BUNDLED_FAKE_NVML={}",
        dest.display()
    );
    println!("cargo:rerun-if-changed={}", crate_dir.display());
    println!(
        "cargo:rerun-if-changed={}",
        root.join("Cargo.lock").display()
    );
    if !crate_dir.join("Cargo.toml").is_file() {
        println!(
            "cargo:warning=crates/fake-nvml is not here: this gpumon's demo needs --nvml-lib or an installed libfake_nvml.so"
        );
        write(&dest, &[]);
        return;
    }
    let target_dir = out.join("fake-nvml-target");
    let target = env::var("TARGET").unwrap_or_default();
    let cross = env::var("HOST").map(|h| h != target).unwrap_or(false);
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .args(["-p", "fake-nvml", "--lib", "--release", "--locked"])
        .arg("--target-dir")
        .arg(&target_dir)
        // Stripped: the library is carried inside every binary. Its exports are dynamic
        // symbols, which stripping keeps.
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        // Under `cargo clippy` the outer cargo lints workspace members through this wrapper;
        // the nested build only compiles (fake-nvml is linted by the outer run).
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env_remove("CARGO_TARGET_DIR")
        // Its stdout would be read as this script's `cargo:` directives.
        .stdout(std::process::Stdio::null());
    if cross {
        cmd.args(["--target", &target]);
    }
    let built = match cmd.status() {
        Ok(s) if s.success() => {
            let sub = if cross {
                target_dir.join(&target)
            } else {
                target_dir
            };
            sub.join("release/libfake_nvml.so")
        }
        Ok(s) => fail(&format!("`cargo build -p fake-nvml` exited with {s}")),
        Err(e) => fail(&format!("cannot run cargo: {e}")),
    };
    match std::fs::read(&built) {
        Ok(bytes) => write(&dest, &bytes),
        Err(e) => fail(&format!("{}: {e}", built.display())),
    }
}

fn write(path: &Path, bytes: &[u8]) {
    if let Err(e) = std::fs::write(path, bytes) {
        fail(&format!("{}: {e}", path.display()));
    }
}

fn fail(why: &str) -> ! {
    eprintln!(
        "building the demo's fake NVML library failed: {why}\n\
         (build without it: --no-default-features; `gpumon demo` then needs an installed \
         libfake_nvml.so or --nvml-lib)"
    );
    std::process::exit(1)
}
