//! Lines a reconnecting client sends again (capability `ack`): each client instance (hello's
//! `instance`, per uid so one user cannot silence another's) has one high-water mark of the
//! `seq` numbers applied, shared by every connection it opens, so a line resent on the next
//! connection, even one opened before the old one closed, is dropped instead of applied twice.
//! Marks of instances with no open connection are forgotten when the table is full: a client
//! gone that long has nothing left to resend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Client instances remembered at most.
const MAX_INSTANCES: usize = 8192;

#[derive(Default)]
pub struct Resume {
    marks: Mutex<HashMap<(u32, String), Arc<Mark>>>,
}

/// The highest `seq` applied for one client instance.
#[derive(Debug, Default)]
pub struct Mark(AtomicU64);

impl Mark {
    /// Whether `seq` is new (above the mark); if so the mark moves up to it. One atomic step,
    /// so two connections of one instance, each checking its lines on its own task before the
    /// core applies them, never both take a `seq`.
    pub fn advance(&self, seq: u64) -> bool {
        self.0.fetch_max(seq, Ordering::Relaxed) < seq
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Resume {
    /// The mark of `instance` for `uid`; a fresh one for a client that gave no instance.
    pub fn mark(&self, uid: u32, instance: Option<&str>) -> Arc<Mark> {
        let Some(instance) = instance else {
            return Arc::default();
        };
        let mut marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = marks.get(&(uid, instance.to_owned())) {
            return m.clone();
        }
        if marks.len() >= MAX_INSTANCES {
            // Only marks nobody holds: an open connection's mark must stay shared.
            marks.retain(|_, m| Arc::strong_count(m) > 1);
        }
        let m = Arc::<Mark>::default();
        if marks.len() < MAX_INSTANCES {
            marks.insert((uid, instance.to_owned()), m.clone());
        }
        m
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.marks.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
