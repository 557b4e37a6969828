//! Who gets a connection slot. A connection that has not said hello yet holds its slot only on
//! sufferance: when the table is full for it, the oldest one of the user holding the most such
//! connections is evicted instead of refusing the newcomer, so silent connections can never
//! lock trainers out. Slots are `Slot` guards moved into the connection's task, so a slot is
//! given back on every path out of it, a panic included.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio_util::sync::CancellationToken;

use super::IngestStats;

/// The caps admission enforces (from `Limits`).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub max_connections: usize,
    pub max_per_uid: usize,
    /// Slots never taken by connections without hello.
    pub reserved: usize,
}

impl Caps {
    /// At most this many connections wait for their hello at once (at least one, whatever the
    /// config says, so a trainer can always get in).
    fn pending_cap(&self) -> usize {
        self.max_connections.saturating_sub(self.reserved).max(1)
    }
}

/// Why a new connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` connections are open and every one of them has said hello.
    Full,
    /// This uid holds `max_per_uid` connections that have all said hello.
    PerUid,
}

/// Why a connection without hello was told to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// Its user was at `max_per_uid`.
    PerUid,
    /// The slots open to connections without hello were all taken.
    Pending,
}

#[derive(Default)]
struct Uid {
    held: usize,
    /// Connections without hello, oldest first (ids only grow), with the token that evicts one.
    pending: BTreeMap<u64, (CancellationToken, EvictedBy)>,
}

/// Set once, just before the token is cancelled.
type EvictedBy = Arc<OnceLock<Eviction>>;

struct Table {
    caps: Caps,
    next: u64,
    total: usize,
    pending: usize,
    uids: HashMap<u32, Uid>,
}

impl Table {
    /// Takes a slot for `uid`, evicting a connection without hello where one must make room.
    fn admit(&mut self, uid: u32) -> Result<(u64, CancellationToken, EvictedBy), Refusal> {
        if self.held_by(uid) >= self.caps.max_per_uid && !self.evict(uid, Eviction::PerUid) {
            return Err(Refusal::PerUid);
        }
        if self.total >= self.caps.max_connections || self.pending >= self.caps.pending_cap() {
            let heaviest = self
                .uids
                .iter()
                .filter_map(|(u, e)| {
                    Some((
                        e.pending.len(),
                        std::cmp::Reverse(*e.pending.keys().next()?),
                        *u,
                    ))
                })
                .max()
                .map(|(_, _, u)| u);
            let made_room = heaviest.is_some_and(|u| self.evict(u, Eviction::Pending));
            if !made_room && self.total >= self.caps.max_connections {
                return Err(Refusal::Full);
            }
        }
        self.next += 1;
        let token = CancellationToken::new();
        let by = EvictedBy::default();
        let e = self.uids.entry(uid).or_default();
        e.held += 1;
        e.pending.insert(self.next, (token.clone(), by.clone()));
        self.total += 1;
        self.pending += 1;
        Ok((self.next, token, by))
    }

    fn held_by(&self, uid: u32) -> usize {
        self.uids.get(&uid).map_or(0, |e| e.held)
    }

    /// Evicts `uid`'s oldest connection without hello; its slot is free at once (its task
    /// closes it soon after). False when it has none.
    fn evict(&mut self, uid: u32, why: Eviction) -> bool {
        let Some(e) = self.uids.get_mut(&uid) else {
            return false;
        };
        let Some((_, (token, by))) = e.pending.pop_first() else {
            return false;
        };
        let _ = by.set(why);
        token.cancel();
        self.free(uid, true);
        true
    }

    /// One slot of `uid` is given up; `pending` says whether it was still waiting for hello.
    fn free(&mut self, uid: u32, pending: bool) {
        self.total = self.total.saturating_sub(1);
        if pending {
            self.pending = self.pending.saturating_sub(1);
        }
        if let Some(e) = self.uids.get_mut(&uid) {
            e.held = e.held.saturating_sub(1);
            if e.held == 0 && e.pending.is_empty() {
                self.uids.remove(&uid);
            }
        }
    }

    /// The connection said hello: it is no longer evictable. False if it had been evicted
    /// meanwhile; it is then counted again (briefly one over the cap at worst), since its
    /// session is open.
    fn greet(&mut self, uid: u32, id: u64) -> bool {
        let e = self.uids.entry(uid).or_default();
        if e.pending.remove(&id).is_some() {
            self.pending = self.pending.saturating_sub(1);
            return true;
        }
        e.held += 1;
        self.total += 1;
        false
    }

    /// The connection ended.
    fn release(&mut self, uid: u32, id: u64, greeted: bool) {
        if greeted {
            self.free(uid, false);
        } else if let Some(e) = self.uids.get_mut(&uid) {
            // Not pending any more: it was evicted, and its slot freed then.
            if e.pending.remove(&id).is_some() {
                self.free(uid, true);
            }
        }
    }
}

/// The connection table, shared by the accept loop and the connection tasks.
pub struct Admission {
    table: Mutex<Table>,
    stats: Arc<IngestStats>,
}

impl Admission {
    pub fn new(caps: Caps, stats: Arc<IngestStats>) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Table {
                caps,
                next: 0,
                total: 0,
                pending: 0,
                uids: HashMap::new(),
            }),
            stats,
        })
    }

    /// A slot for a new connection from `uid`, or why not.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Slot, Refusal> {
        let mut t = lock(&self.table);
        let r = t.admit(uid);
        self.publish(&t);
        let (id, evict, evicted_by) = r?;
        Ok(Slot {
            admission: self.clone(),
            uid,
            id,
            greeted: false,
            evict,
            evicted_by,
        })
    }

    /// (open connections, of which without hello).
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        let t = lock(&self.table);
        (t.total, t.pending)
    }

    fn publish(&self, t: &Table) {
        self.stats
            .connections
            .store(t.total as u64, Ordering::Relaxed);
    }
}

/// One connection's slot; given back when dropped.
pub struct Slot {
    admission: Arc<Admission>,
    uid: u32,
    id: u64,
    greeted: bool,
    evict: CancellationToken,
    evicted_by: EvictedBy,
}

impl Slot {
    /// The connection's hello was accepted: it keeps its slot from now on.
    pub fn greet(&mut self) {
        if self.greeted {
            return;
        }
        self.greeted = true;
        let mut t = lock(&self.admission.table);
        t.greet(self.uid, self.id);
        self.admission.publish(&t);
    }

    pub fn greeted(&self) -> bool {
        self.greeted
    }

    /// Resolves when the connection is evicted to make room (only before its hello).
    pub async fn evicted(&self) -> Eviction {
        self.evict.cancelled().await;
        self.evicted_by.get().copied().unwrap_or(Eviction::Pending)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = lock(&self.admission.table);
        t.release(self.uid, self.id, self.greeted);
        self.admission.publish(&t);
    }
}

/// The table stays consistent even if a holder panicked: every update is a few integer and map
/// operations that cannot panic halfway in a way that matters, so a poisoned lock is used as is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
