//! A map keyed by pid with a multiplicative hash instead of SipHash: the poll looks up every GPU
//! process in two such maps each time, and pids come from the kernel, not from a client, so
//! there is no flooding to defend against.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy)]
pub struct PidHasher(u64);

impl Hasher for PidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the high bits, which the table's control bytes use, mix every
        // input bit.
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub type PidMap<V> = HashMap<u32, V, BuildHasherDefault<PidHasher>>;

#[cfg(test)]
mod tests;
