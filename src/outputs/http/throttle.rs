//! Basic-auth failures, throttled per peer address: a token bucket of `BURST` failures that
//! refills one each `REFILL`. A peer with none left is answered 429 before its credentials are
//! looked at, so a wrong-password flood costs its sender a round trip and the daemon a map
//! lookup, never a bcrypt check; credentials verified before (remembered by `Auth`) are let in
//! without consulting the bucket, so a scraper behind the same address is not locked out.
//!
//! An IPv6 peer is counted by its /64 (one host holds a whole /64 and could otherwise spend a
//! new address per try). When the table is full of peers still throttled (a flood from more
//! networks than it holds), newcomers share one overflow bucket rather than the table being
//! cleared: the flood keeps paying, and nobody's throttle is lifted by it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures a peer may have before it is throttled.
pub const BURST: f64 = 5.0;
/// One more failure allowed after this long.
pub const REFILL: Duration = Duration::from_secs(2);
/// Peers remembered at most; when full, those whose bucket has refilled are forgotten first.
const PEERS: usize = 65_536;
/// The overflow bucket holds this many peers' bursts: a few newcomers still get through.
const OVERFLOW_BURST: f64 = 4.0 * BURST;

struct Bucket {
    tokens: f64,
    at: Instant,
    /// Tokens it holds at most: `BURST`, or `OVERFLOW_BURST` for the shared one.
    cap: f64,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() / REFILL.as_secs_f64();
        self.tokens = (self.tokens + gained).min(self.cap);
        self.at = now;
    }
}

pub struct AuthThrottle {
    peers: Mutex<Table>,
    /// Peers remembered at most (`PEERS`; smaller in tests).
    cap: usize,
}

struct Table {
    peers: HashMap<IpAddr, Bucket>,
    /// Shared by peers that found the table full of throttled ones.
    overflow: Bucket,
}

impl Default for AuthThrottle {
    fn default() -> Self {
        Self::with_cap(PEERS)
    }
}

/// What a peer is counted as: its address, or for IPv6 its /64 (an IPv4-mapped address is the
/// IPv4 address it maps).
fn key(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

impl AuthThrottle {
    fn with_cap(cap: usize) -> Self {
        Self {
            peers: Mutex::new(Table {
                peers: HashMap::new(),
                overflow: Bucket {
                    tokens: OVERFLOW_BURST,
                    at: Instant::now(),
                    cap: OVERFLOW_BURST,
                },
            }),
            cap,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Nothing panics while holding the lock (arithmetic and map operations); recover anyway.
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one try for `peer` (given back by `passed`): None when it may try its
    /// credentials, else how long until it may again. Taken before the check, so many requests
    /// at once from one peer cannot all slip through before the first failure is counted.
    pub fn take(&self, peer: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let peer = key(peer);
        let mut t = self.table();
        let cap = self.cap;
        let b = t.bucket(peer, now, cap);
        b.refill(now);
        if b.tokens < 1.0 {
            return Some(REFILL.mul_f64(1.0 - b.tokens));
        }
        b.tokens -= 1.0;
        None
    }

    /// The credentials `peer` tried were right: its try is given back.
    pub fn passed(&self, peer: IpAddr) {
        let mut t = self.table();
        let b = t.existing(key(peer));
        b.tokens = (b.tokens + 1.0).min(b.cap);
    }
}

impl Table {
    /// The peer's bucket, or the overflow's when the table is full of throttled peers.
    fn bucket(&mut self, peer: IpAddr, now: Instant, cap: usize) -> &mut Bucket {
        if !self.peers.contains_key(&peer) && self.peers.len() >= cap {
            self.peers.retain(|_, b| {
                b.refill(now);
                b.tokens < BURST
            });
            if self.peers.len() >= cap {
                return &mut self.overflow;
            }
        }
        self.peers.entry(peer).or_insert(Bucket {
            tokens: BURST,
            at: now,
            cap: BURST,
        })
    }

    /// The bucket the peer's last try was taken from.
    fn existing(&mut self, peer: IpAddr) -> &mut Bucket {
        match self.peers.get_mut(&peer) {
            Some(b) => b,
            None => &mut self.overflow,
        }
    }
}

#[cfg(test)]
mod tests;
