//! The snapshot's `cursor` (`/api/v1/snapshot?since=`): what one answer held, so that the next
//! one sends only what came after it. The daemon writes it and reads it back; clients pass it
//! on unread. It names the daemon process, so a cursor from another daemon, or from before a
//! restart, is not honoured: that answer is whole.
//!
//! Text, numbers in base 36, URL-safe: `<instance>.<gpu>.<procs>.<sessions>`: the process; the
//! time in ms of the newest GPU history point; `<gpu index>-<hash>` of each GPU's processes as
//! sent (kept.rs), `_`-separated; then `<rise>-<samples>` per session, `_`-separated: the rise
//! of its numeric key over the one before, and its `samples`, the count of points its series
//! ever took. Sessions without samples are left out, and so are those past `MAX_LEN`: they are
//! sent whole.

use std::sync::OnceLock;

/// The longest cursor written: a request head must fit in `http.max_request_head_bytes` (8 KiB
/// at least) with the cursor in its URL. About 600 sessions fit.
const MAX_LEN: usize = 4096;

/// What the answer that wrote a cursor held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Time (ms) of the newest GPU history point then.
    pub gpu_ms: i64,
    /// (GPU index, hash of its processes), by index.
    pub procs: Vec<(u32, u64)>,
    /// (numeric key, samples) of each session, by key.
    sessions: Vec<(u64, u64)>,
}

impl Cursor {
    /// The cursor in `text`, when this daemon process wrote it.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split('.');
        if parts.next()? != instance() {
            return None;
        }
        let gpu_ms = i64::try_from(base36(parts.next()?)?).ok()?;
        let procs = pairs(parts.next()?)?
            .into_iter()
            .map(|(gpu, hash)| Some((u32::try_from(gpu).ok()?, hash)))
            .collect::<Option<_>>()?;
        let mut key = 0u64;
        let mut sessions = pairs(parts.next()?)?;
        for (rise, _) in &mut sessions {
            key = key.checked_add(*rise)?;
            *rise = key;
        }
        if parts.next().is_some() {
            return None;
        }
        Some(Self {
            gpu_ms,
            procs,
            sessions,
        })
    }

    /// The samples the client holds of the session with numeric `key` (0: none, send it whole).
    pub fn samples(&self, key: u64) -> u64 {
        self.sessions
            .binary_search_by_key(&key, |(k, _)| *k)
            .map_or(0, |i| self.sessions[i].1)
    }

    /// Writes the cursor for an answer whose newest GPU point is at `gpu_ms`, whose GPUs' processes
    /// hash to `procs`, with `sessions` as (numeric key, samples).
    pub fn write(gpu_ms: i64, procs: &[(u32, u64)], mut sessions: Vec<(u64, u64)>) -> String {
        let procs: Vec<String> = procs
            .iter()
            .map(|(g, h)| format!("{}-{}", to_base36(u64::from(*g)), to_base36(*h)))
            .collect();
        let mut out = format!(
            "{}.{}.{}.",
            instance(),
            to_base36(gpu_ms.max(0) as u64),
            procs.join("_")
        );
        sessions.sort_unstable();
        let (mut last, mut sep) = (0, "");
        for (key, samples) in sessions.into_iter().filter(|(_, n)| *n > 0) {
            let part = format!("{sep}{}-{}", to_base36(key - last), to_base36(samples));
            if out.len() + part.len() > MAX_LEN {
                break;
            }
            out.push_str(&part);
            (last, sep) = (key, "_");
        }
        out
    }
}

/// `a-b_c-d`: [(a, b), (c, d)]; empty: none.
fn pairs(text: &str) -> Option<Vec<(u64, u64)>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split('_')
        .map(|p| {
            let (a, b) = p.split_once('-')?;
            Some((base36(a)?, base36(b)?))
        })
        .collect()
}

/// The number at the end of a session id (`s-mi8dfxmo-17`, `s-17` in a replay).
pub fn session_key(id: &str) -> Option<u64> {
    id.rsplit('-').next()?.parse().ok()
}

/// This process, as cursors name it: its first snapshot's time in ns, which a restarted daemon
/// cannot share.
fn instance() -> &'static str {
    static INSTANCE: OnceLock<String> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        to_base36(ns ^ u64::from(std::process::id()))
    })
}

fn base36(s: &str) -> Option<u64> {
    // from_str_radix takes a sign; a cursor never has one.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    u64::from_str_radix(s, 36).ok()
}

/// Written as session ids write their daemon's start.
fn to_base36(n: u64) -> String {
    crate::core::store::sessions::base36(n)
}

#[cfg(test)]
mod tests;
