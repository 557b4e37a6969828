//! External tools the operations tests drive (systemd-analyze, systemd-socket-activate,
//! promtool). scripts/check installs them and sets GPUMON_REQUIRE_TOOLS=1, so there a missing
//! tool fails the test; elsewhere the test says why it skipped.
#![allow(dead_code)]

use std::path::PathBuf;

/// The tool's path on PATH, or None after printing why the calling test is skipped.
/// Panics when GPUMON_REQUIRE_TOOLS is set and the tool is missing.
pub fn find(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let msg = format!("{name} not found: install the Debian package {package}");
        if std::env::var_os("GPUMON_REQUIRE_TOOLS").is_some() {
            panic!("{msg} (GPUMON_REQUIRE_TOOLS is set, so this test cannot be skipped)");
        }
        eprintln!("SKIPPED: {msg}");
    }
    found
}
