//! Basic-auth failures, throttled per peer address: a token bucket of `BURST` failures that
//! refills one each `REFILL`. A peer with none left is answered 429 before its credentials are
//! looked at, so a wrong-password flood costs its sender a round trip and the daemon a map
//! lookup, never a bcrypt check; credentials verified before (remembered by `Auth`) are let in
//! without consulting the bucket, so a scraper behind the same address is not locked out.

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

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let gained = now.saturating_duration_since(self.at).as_secs_f64() / REFILL.as_secs_f64();
        self.tokens = (self.tokens + gained).min(BURST);
        self.at = now;
    }
}

#[derive(Default)]
pub struct AuthThrottle {
    peers: Mutex<HashMap<IpAddr, Bucket>>,
}

impl AuthThrottle {
    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Bucket>> {
        // Nothing panics while holding the lock (arithmetic and map operations); recover anyway.
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one try for `peer` (given back by `passed`): None when it may try its
    /// credentials, else how long until it may again. Taken before the check, so many requests
    /// at once from one peer cannot all slip through before the first failure is counted.
    pub fn take(&self, peer: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let mut peers = self.peers();
        if let Some(b) = peers.get_mut(&peer) {
            b.refill(now);
            if b.tokens < 1.0 {
                return Some(REFILL.mul_f64(1.0 - b.tokens));
            }
        }
        self.charge(&mut peers, peer, now);
        None
    }

    /// The credentials `peer` tried were right: its try is given back.
    pub fn passed(&self, peer: IpAddr) {
        if let Some(b) = self.peers().get_mut(&peer) {
            b.tokens = (b.tokens + 1.0).min(BURST);
        }
    }

    fn charge(&self, peers: &mut HashMap<IpAddr, Bucket>, peer: IpAddr, now: Instant) {
        if peers.len() >= PEERS && !peers.contains_key(&peer) {
            peers.retain(|_, b| {
                b.refill(now);
                b.tokens < BURST
            });
            if peers.len() >= PEERS {
                // Every one is still throttled (a flood from many addresses): start over
                // rather than grow; each gets its burst again.
                peers.clear();
            }
        }
        let b = peers.entry(peer).or_insert(Bucket {
            tokens: BURST,
            at: now,
        });
        b.refill(now);
        b.tokens = (b.tokens - 1.0).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_throttled_after_its_burst_and_others_are_not() {
        let t = AuthThrottle::default();
        let (bad, good) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        for i in 0..BURST as usize {
            assert_eq!(t.take(bad), None, "failure {i}");
        }
        let wait = t.take(bad).expect("throttled after its burst");
        assert!(wait > Duration::ZERO && wait <= REFILL, "{wait:?}");
        for _ in 0..10 {
            assert_eq!(t.take(good), None, "right credentials give their try back");
            t.passed(good);
        }
    }
}
