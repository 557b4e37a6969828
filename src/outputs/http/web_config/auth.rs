//! Basic auth against the file's bcrypt hashes. A bcrypt check costs tens of milliseconds at
//! cost 10 (that is its point), so a verified (user, password) is remembered, as a SHA-256 of
//! both with the hash, and later requests cost a lookup; an unknown user costs a check against
//! a dummy hash, so response times do not tell which users exist.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use base64::Engine;

/// Verified credentials remembered at most (the set is emptied when full).
const REMEMBERED: usize = 1024;
/// A cost-10 hash of a random password, checked for unknown users (made once, when needed).
static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

#[derive(Default)]
pub struct Auth {
    users: BTreeMap<String, String>,
    verified: Mutex<HashSet<[u8; 32]>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No users configured: nothing to check.
    Open,
    Allowed,
    Denied,
}

impl Auth {
    pub fn new(users: BTreeMap<String, String>) -> Self {
        Self {
            users,
            verified: Mutex::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.users.is_empty()
    }

    /// How many users the file lists.
    pub fn users(&self) -> usize {
        self.users.len()
    }

    /// The verdict when it costs no bcrypt (no users, a header that cannot be right, or
    /// credentials verified before); None when `check` has to run bcrypt.
    pub fn quick(&self, header: Option<&[u8]>) -> Option<Verdict> {
        if self.users.is_empty() {
            return Some(Verdict::Open);
        }
        let Some((user, password)) = header.and_then(basic) else {
            return Some(Verdict::Denied);
        };
        let hash = self.users.get(&user)?;
        let key = fingerprint(&user, &password, hash);
        let seen = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        seen.contains(&key).then_some(Verdict::Allowed)
    }

    /// Checks an `Authorization` header value. May run bcrypt: call it off the async workers.
    pub fn check(&self, header: Option<&[u8]>) -> Verdict {
        if self.users.is_empty() {
            return Verdict::Open;
        }
        let Some((user, password)) = header.and_then(basic) else {
            return Verdict::Denied;
        };
        let hash = self.users.get(&user);
        let key = fingerprint(&user, &password, hash.map_or("", String::as_str));
        let mut seen = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if hash.is_some() && seen.contains(&key) {
            return Verdict::Allowed;
        }
        drop(seen);
        let ok = match hash {
            Some(h) => bcrypt::verify(&password, h).unwrap_or(false),
            None => {
                let dummy = DUMMY.get_or_init(|| {
                    let mut secret = [0u8; 16];
                    let _ = ring::rand::SecureRandom::fill(
                        &ring::rand::SystemRandom::new(),
                        &mut secret,
                    );
                    bcrypt::hash(secret, 10).unwrap_or_default()
                });
                let _ = bcrypt::verify(&password, dummy);
                false
            }
        };
        if !ok {
            return Verdict::Denied;
        }
        seen = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= REMEMBERED {
            seen.clear();
        }
        seen.insert(key);
        Verdict::Allowed
    }
}

/// `Basic base64(user:password)` → (user, password).
fn basic(header: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(header).ok()?.trim();
    let (scheme, b64) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let (user, password) = std::str::from_utf8(&raw).ok()?.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

fn fingerprint(user: &str, password: &str, hash: &str) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user, password, hash] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part.as_bytes());
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}
