//! A reload fails closed. The file is applied only once it has held still (a writer such as
//! `cat new > web.yml` truncates it, then writes: read between the two, it is empty or half a
//! file), and never when it would take TLS or authentication away: a file that lost them is far
//! more often a write in progress or a mistake than a wish, and turning them off takes a
//! restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::WebConfig;

/// How long the files must hold still around a read: longer than a writer's pause between
/// truncating and writing, short enough that a SIGHUP answers within a second.
pub(super) const SETTLE: Duration = Duration::from_millis(150);
/// Reads tried while the files keep changing before the reload is refused.
pub(super) const ATTEMPTS: u32 = 5;

/// The config the file at `path` now describes, once the file and the files it names held
/// still for `SETTLE` across the read, and only if it keeps what `current` protects. The error
/// says why not and what to do.
pub(super) fn read_stable(path: &Path, current: &WebConfig) -> Result<WebConfig, String> {
    read_stable_with(path, current, || std::thread::sleep(SETTLE))
}

/// `read_stable`, with `settle` for the wait between two looks: the tests' writers change the
/// file inside it, so what they check does not depend on how a loaded machine schedules them.
pub(super) fn read_stable_with(
    path: &Path,
    current: &WebConfig,
    mut settle: impl FnMut(),
) -> Result<WebConfig, String> {
    // The config file first, then the files named by the config in force and by what was read.
    let mut watched: Vec<PathBuf> = vec![path.to_path_buf()];
    add_new(&mut watched, &current.files);
    for _ in 0..ATTEMPTS {
        let before = fingerprint(&watched);
        settle();
        let text = std::fs::read(path);
        let parsed = match &text {
            Ok(bytes) => match std::str::from_utf8(bytes) {
                Ok(t) => WebConfig::parse(path, t)
                    .map(|c| (c, t.trim().is_empty()))
                    .map_err(|e| e.to_string()),
                Err(_) => Err(format!("{}: is not UTF-8 text", path.display())),
            },
            Err(e) => Err(format!("{}: cannot read it: {e}", path.display())),
        };
        let after = fingerprint(&watched);
        // The text parsed is the one that held still, and so are the files it named (read
        // between the two fingerprints).
        let same_text = after.first() == Some(&text.as_ref().ok().map(|b| digest(b)));
        let names_more = parsed
            .as_ref()
            .is_ok_and(|(c, _)| c.files.iter().any(|f| !watched.contains(f)));
        if before == after && same_text && !names_more {
            let (config, empty) = parsed?;
            return keeps_protection(path, current, config, empty);
        }
        if let Ok((c, _)) = &parsed {
            add_new(&mut watched, &c.files);
        }
    }
    Err(format!(
        "{}: still changing after {ATTEMPTS} reads {SETTLE:?} apart, so it may be half-written; write the new file beside it and rename it over, and it is read once it holds still (or send SIGHUP)",
        path.display()
    ))
}

/// `config`, unless it would serve with less protection than `current`.
fn keeps_protection(
    path: &Path,
    current: &WebConfig,
    config: WebConfig,
    empty: bool,
) -> Result<WebConfig, String> {
    let restart = "to serve without it, change the file and restart gpumon";
    let file = path.display();
    if empty {
        return Err(format!("{file}: is empty (a write in progress?), which would serve plain HTTP with no authentication; {restart}"));
    }
    if current.tls.is_some() && config.tls.is_none() {
        return Err(format!("{file}: has no tls_server_config certificate, which would turn TLS off; put it back, or {restart}"));
    }
    if current.client_certs && !config.client_certs {
        return Err(format!("{file}: tls_server_config.client_auth_type is no longer RequireAndVerifyClientCert, which would stop requiring client certificates; put it back, or {restart}"));
    }
    if current.auth.enabled() && !config.auth.enabled() {
        return Err(format!("{file}: has no basic_auth_users, which would turn basic auth off; put them back, or {restart}"));
    }
    Ok(config)
}

fn add_new(watched: &mut Vec<PathBuf>, files: &[PathBuf]) {
    for f in files {
        if !watched.contains(f) {
            watched.push(f.clone());
        }
    }
}

/// A SHA-256 of each file's content, None for one that cannot be read.
fn fingerprint(paths: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    paths
        .iter()
        .map(|p| std::fs::read(p).ok().map(|b| digest(&b)))
        .collect()
}

fn digest(bytes: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .to_vec()
}

#[cfg(test)]
mod tests;
