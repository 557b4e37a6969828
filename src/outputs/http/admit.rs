//! Who gives way when `http.connection_limit` connections are open: a new connection is let in
//! by closing the oldest one that has no request in flight, preferring one that never completed
//! a request (half-open or silent) over an idle keep-alive. So a scraper always gets in, however
//! many slow or silent clients hold slots; only when every slot is busy serving a request is the
//! newcomer refused. The ingest socket's reserve works the same way (connections without a hello
//! give way first).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// How readily a connection gives way; lower goes first, `None` never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Yield {
    /// No request completed yet: half-open, silent, or still in its TLS handshake.
    Unproven,
    /// Has been served, and waits idle between requests.
    Idle,
}

/// Something that can say how readily its connection gives way right now.
pub(super) trait Yielding: Send + Sync {
    fn yields(&self) -> Option<Yield>;
}

struct Entry {
    who: Arc<dyn Yielding>,
    evict: CancellationToken,
}

/// The open connections in the order they were accepted.
#[derive(Default)]
pub(super) struct Admission {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Entry>,
}

impl Admission {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Nothing panics while holding the lock (map operations and `yields`, which itself only
        // reads under its own lock); recover anyway.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection; it is told to close through the returned token, and leaves the
    /// table when the guard is dropped, however its task ends.
    pub(super) fn register(
        self: &Arc<Self>,
        who: Arc<dyn Yielding>,
    ) -> (CancellationToken, Registered) {
        let evict = CancellationToken::new();
        let mut t = self.table();
        let id = t.next;
        t.next += 1;
        t.open.insert(
            id,
            Entry {
                who,
                evict: evict.clone(),
            },
        );
        (evict, Registered(self.clone(), id))
    }

    /// Whether one more connection may come in under `cap`: yes while the table (connections
    /// open and not told to close) holds fewer; else the one that gives way most readily (the
    /// oldest of its kind) is told to close and forgotten, so it is not chosen twice. False when
    /// every connection is serving a request. An evicted connection counts as open until its
    /// task has dropped it, a moment later: the open count overshoots by at most those.
    pub(super) fn make_room(&self, cap: usize) -> bool {
        let mut t = self.table();
        if t.open.len() < cap {
            return true;
        }
        let mut best: Option<(Yield, u64)> = None;
        for (id, e) in &t.open {
            match e.who.yields() {
                // The oldest unproven connection: nothing can beat it.
                Some(Yield::Unproven) => {
                    best = Some((Yield::Unproven, *id));
                    break;
                }
                Some(y) if best.is_none() => best = Some((y, *id)),
                _ => {}
            }
        }
        match best.and_then(|(_, id)| t.open.remove(&id)) {
            Some(e) => {
                e.evict.cancel();
                true
            }
            None => false,
        }
    }
}

/// Removes its connection from the table when dropped.
pub(super) struct Registered(Arc<Admission>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.table().open.remove(&self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Mutex<Option<Yield>>);

    impl Yielding for Fixed {
        fn yields(&self) -> Option<Yield> {
            *self.0.lock().unwrap()
        }
    }

    fn conn(a: &Arc<Admission>, y: Option<Yield>) -> (CancellationToken, Registered) {
        a.register(Arc::new(Fixed(Mutex::new(y))))
    }

    #[test]
    fn the_oldest_unproven_connection_goes_first_then_the_oldest_idle_never_a_busy_one() {
        let a = Arc::new(Admission::default());
        let (busy, _g0) = conn(&a, None);
        let (idle_old, _g1) = conn(&a, Some(Yield::Idle));
        let (idle_new, _g2) = conn(&a, Some(Yield::Idle));
        let (unproven_old, _g3) = conn(&a, Some(Yield::Unproven));
        let (unproven_new, _g4) = conn(&a, Some(Yield::Unproven));
        let order = [&unproven_old, &unproven_new, &idle_old, &idle_new];
        for (i, expected) in order.iter().enumerate() {
            assert!(a.make_room(0), "eviction {i}");
            assert!(expected.is_cancelled(), "eviction {i} chose another");
            assert!(order[i + 1..].iter().all(|t| !t.is_cancelled()));
            assert!(!busy.is_cancelled());
        }
        assert!(
            !a.make_room(0),
            "a connection serving a request never gives way"
        );
        assert!(!busy.is_cancelled());
    }

    #[test]
    fn a_closed_connection_leaves_the_table() {
        let a = Arc::new(Admission::default());
        let (t, g) = conn(&a, Some(Yield::Unproven));
        drop(g);
        assert!(!a.make_room(0));
        assert!(!t.is_cancelled());
    }
}
