//! Who gets a connection slot, decided under one lock so that no burst of connects or hellos
//! can overshoot `max_connections`.
//!
//! A connection without hello holds its slot only on sufferance: when the table is full for
//! it, the oldest one of the user holding the most such connections is evicted instead of
//! refusing the newcomer. When every slot has said hello, a newcomer whose uid holds less than
//! its fair share (`max_connections / users holding slots`, the newcomer's counted, at least 1)
//! is let in to wait for its hello (one such connection beyond the cap at a time: the next
//! connect evicts it as pending), and its hello takes the slot of the quietest session of the
//! user holding the most over that share: one that never sent a line after its hello first,
//! then the one silent longest. So no set of users can keep another user's trainer out, and a
//! connection that never says hello never evicts a session.
//!
//! A hello takes its session slot (`Slot::claim`) before the hello is applied, so an evicted
//! connection never opens a session, and a session evicted to make room counts against the
//! cap until its task has closed it: sessions open never exceed `max_connections`. Slots are
//! `Slot` guards moved into the connection's task, given back on every path out of it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use tokio::sync::Notify;
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
    /// At most this many connections wait for their hello at once (at least one, so a trainer
    /// can always get in).
    fn pending_cap(&self) -> usize {
        self.max_connections.saturating_sub(self.reserved).max(1)
    }
}

/// How the slots were shared when a decision was made, for the message that explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Slots the uid concerned held.
    pub held: usize,
    /// `max_connections / users`, at least 1.
    pub share: usize,
    /// Users holding slots, the newcomer's counted.
    pub users: usize,
}

/// Why a new connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot has said hello, and the newcomer's uid holds its fair share already (or no
    /// other uid holds more than its own).
    Full(Share),
    /// This uid holds `max_per_uid` connections that have all said hello.
    PerUid,
}

/// Why a connection was told to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// No hello yet, and its user was at `max_per_uid`.
    PerUid,
    /// No hello yet, and the slots open to connections without hello were all taken.
    Pending,
    /// Its hello found every slot taken by sessions, and its uid at its fair share already (or
    /// no other uid over it): refused, as `Refusal::Full` is at connect.
    Full(Share),
    /// A session of a user over its fair share, its quietest, made room for another user.
    Fair {
        share: Share,
        /// It had sent a line after its hello.
        active: bool,
        /// Milliseconds since its last line.
        silent_ms: u64,
    },
}

/// What a connection's task and the table share about its slot.
#[derive(Default)]
struct Shared {
    evict: CancellationToken,
    /// Set once, just before `evict` is cancelled.
    why: OnceLock<Eviction>,
    /// Evicted after its hello: counted in `Table::leaving` until the slot is dropped.
    leaving: AtomicBool,
    /// Milliseconds from the table's epoch to the connection's last line after its hello.
    last: AtomicU64,
    /// A line came after its hello: not merely a quiet session.
    active: AtomicBool,
    /// Its hello evicted a session over its user's fair share: it evicts no second one while
    /// that one closes.
    made_room: AtomicBool,
}

#[derive(Default)]
struct Uid {
    /// Connections without hello, and sessions, oldest first (ids only grow).
    pending: BTreeMap<u64, Arc<Shared>>,
    greeted: BTreeMap<u64, Arc<Shared>>,
}

impl Uid {
    fn held(&self) -> usize {
        self.pending.len() + self.greeted.len()
    }
}

/// The outcome of a hello asking for its session slot.
enum Claim {
    Taken,
    /// Evicted sessions still closing hold the cap: wait for one to go.
    Wait,
    Evicted(Eviction),
}

struct Table {
    caps: Caps,
    epoch: Instant,
    next: u64,
    pending: usize,
    greeted: usize,
    /// Sessions evicted whose tasks have not closed them yet.
    leaving: usize,
    uids: HashMap<u32, Uid>,
}

impl Table {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn total(&self) -> usize {
        self.pending + self.greeted
    }

    fn held_by(&self, uid: u32) -> usize {
        self.uids.get(&uid).map_or(0, Uid::held)
    }

    /// Takes a slot for `uid` to wait for its hello, evicting a connection without hello where
    /// one must make room. Never a session: those give way to a hello only (`claim`). When every
    /// slot has said hello, it is let in only if its hello could take a fair slot; it is then
    /// the only connection beyond the cap, as the next connect evicts it as pending.
    fn admit(&mut self, uid: u32) -> Result<(u64, Arc<Shared>), Refusal> {
        if self.held_by(uid) >= self.caps.max_per_uid && !self.evict_pending(uid, Eviction::PerUid)
        {
            return Err(Refusal::PerUid);
        }
        if self.total() >= self.caps.max_connections || self.pending >= self.caps.pending_cap() {
            let heaviest = self
                .uids
                .iter()
                .filter_map(|(u, e)| {
                    let oldest = *e.pending.keys().next()?;
                    Some((e.pending.len(), std::cmp::Reverse(oldest), *u))
                })
                .max()
                .map(|(_, _, u)| u);
            let made_room = heaviest.is_some_and(|u| self.evict_pending(u, Eviction::Pending));
            if !made_room && self.total() >= self.caps.max_connections {
                self.fair_victim(uid, 0)?;
            }
        }
        self.next += 1;
        let shared = Arc::new(Shared::default());
        let e = self.uids.entry(uid).or_default();
        e.pending.insert(self.next, shared.clone());
        self.pending += 1;
        Ok((self.next, shared))
    }

    /// Evicts `uid`'s oldest connection without hello; its slot is free at once (it has no
    /// session; its task closes it soon after). False when it has none.
    fn evict_pending(&mut self, uid: u32, why: Eviction) -> bool {
        let Some(e) = self.uids.get_mut(&uid) else {
            return false;
        };
        let Some((_, shared)) = e.pending.pop_first() else {
            return false;
        };
        self.pending -= 1;
        self.forget_if_empty(uid);
        let _ = shared.why.set(why);
        shared.evict.cancel();
        true
    }

    /// Every slot has said hello: the user most over its fair share, who would give a session
    /// to `newcomer` (holding `own` slots that are not counted: the claiming connection's),
    /// with that share; or the refusal that applies.
    fn fair_victim(
        &self,
        newcomer: u32,
        own: usize,
    ) -> Result<(u32, usize, usize, usize), Refusal> {
        let users = self.uids.len() + usize::from(!self.uids.contains_key(&newcomer));
        let share = (self.caps.max_connections / users.max(1)).max(1);
        let held = self.held_by(newcomer).saturating_sub(own);
        let full = Refusal::Full(Share { held, share, users });
        if held >= share {
            return Err(full);
        }
        // The most over; among equals the lowest uid, so the choice is reproducible.
        self.uids
            .iter()
            .filter(|(u, e)| **u != newcomer && e.held() > share && !e.greeted.is_empty())
            .max_by_key(|(u, e)| (e.held(), std::cmp::Reverse(**u)))
            .map(|(u, e)| (*u, e.held(), share, users))
            .ok_or(full)
    }

    /// A hello found every slot taken by sessions: takes one for `newcomer` (whose claiming
    /// connection is not counted) from the user most over its fair share, or refuses with the
    /// share that applied.
    fn evict_fair(&mut self, newcomer: u32) -> Result<(), Refusal> {
        let (victim, victim_held, share, users) = self.fair_victim(newcomer, 1)?;
        let full = Refusal::Full(Share {
            held: self.held_by(newcomer).saturating_sub(1),
            share,
            users,
        });
        let now = self.now_ms();
        let Some(e) = self.uids.get_mut(&victim) else {
            return Err(full);
        };
        // Quiet first: never sent a line after its hello, then silent longest, then oldest.
        let quietest = e
            .greeted
            .iter()
            .min_by_key(|(id, s)| {
                let active = s.active.load(Ordering::Relaxed);
                (active, s.last.load(Ordering::Relaxed), **id)
            })
            .map(|(id, _)| *id);
        let Some(shared) = quietest.and_then(|id| e.greeted.remove(&id)) else {
            return Err(full);
        };
        self.greeted -= 1;
        self.leaving += 1;
        self.forget_if_empty(victim);
        shared.leaving.store(true, Ordering::Relaxed);
        let why = Eviction::Fair {
            share: Share {
                held: victim_held,
                share,
                users,
            },
            active: shared.active.load(Ordering::Relaxed),
            silent_ms: now.saturating_sub(shared.last.load(Ordering::Relaxed)),
        };
        let _ = shared.why.set(why);
        shared.evict.cancel();
        Ok(())
    }

    fn forget_if_empty(&mut self, uid: u32) {
        if self.uids.get(&uid).is_some_and(|e| e.held() == 0) {
            self.uids.remove(&uid);
        }
    }

    /// A hello asks for its session slot: moves the connection from waiting to greeted.
    fn claim(&mut self, uid: u32, id: u64, shared: &Shared) -> Claim {
        let now = self.now_ms();
        let within = self.greeted + self.leaving < self.caps.max_connections;
        if !self
            .uids
            .get(&uid)
            .is_some_and(|e| e.pending.contains_key(&id))
        {
            return Claim::Evicted(evicted_for(shared));
        }
        if !within {
            // Fair-share eviction happens here, when the newcomer claims a session slot, never
            // at connect: a connection that never says hello evicts no session. One per hello;
            // while sessions evicted (for it or others) are still closing, wait for them.
            if shared.made_room.load(Ordering::Relaxed) && self.leaving > 0 {
                return Claim::Wait;
            }
            return match self.evict_fair(uid) {
                Ok(()) => {
                    shared.made_room.store(true, Ordering::Relaxed);
                    Claim::Wait
                }
                Err(_) if self.leaving > 0 => Claim::Wait,
                Err(Refusal::Full(share)) => Claim::Evicted(Eviction::Full(share)),
                Err(Refusal::PerUid) => Claim::Wait,
            };
        }
        let Some(e) = self.uids.get_mut(&uid) else {
            return Claim::Evicted(evicted_for(shared));
        };
        if let Some(s) = e.pending.remove(&id) {
            s.last.store(now, Ordering::Relaxed);
            e.greeted.insert(id, s);
        }
        self.pending -= 1;
        self.greeted += 1;
        Claim::Taken
    }

    /// The hello was refused after all: the connection waits for a hello again.
    fn unclaim(&mut self, uid: u32, id: u64) {
        if let Some(e) = self.uids.get_mut(&uid) {
            if let Some(s) = e.greeted.remove(&id) {
                e.pending.insert(id, s);
                self.greeted -= 1;
                self.pending += 1;
            }
        }
    }

    /// The connection ended; true when a session evicted to make room has now closed.
    fn release(&mut self, uid: u32, id: u64, shared: &Shared) -> bool {
        if let Some(e) = self.uids.get_mut(&uid) {
            if e.greeted.remove(&id).is_some() {
                self.greeted -= 1;
            } else if e.pending.remove(&id).is_some() {
                self.pending -= 1;
            }
            self.forget_if_empty(uid);
        }
        // Evicted slots are no longer in the maps: a pending one was freed at eviction.
        if shared.leaving.swap(false, Ordering::Relaxed) {
            self.leaving -= 1;
            return true;
        }
        false
    }
}

fn evicted_for(shared: &Shared) -> Eviction {
    shared.why.get().copied().unwrap_or(Eviction::Pending)
}

/// The connection table, shared by the accept loop and the connection tasks.
pub struct Admission {
    table: Mutex<Table>,
    /// The table's epoch, read outside the lock by `Slot::touch`.
    epoch: Instant,
    /// Woken when an evicted session has closed, for hellos waiting on the cap.
    closed: Notify,
    stats: Arc<IngestStats>,
}

impl Admission {
    pub fn new(caps: Caps, stats: Arc<IngestStats>) -> Arc<Self> {
        let epoch = Instant::now();
        Arc::new(Self {
            epoch,
            table: Mutex::new(Table {
                caps,
                epoch,
                next: 0,
                pending: 0,
                greeted: 0,
                leaving: 0,
                uids: HashMap::new(),
            }),
            closed: Notify::new(),
            stats,
        })
    }

    /// A slot for a new connection from `uid`, or why not.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Slot, Refusal> {
        let mut t = lock(&self.table);
        let r = t.admit(uid);
        self.publish(&t);
        let (id, shared) = r?;
        Ok(Slot {
            admission: self.clone(),
            uid,
            id,
            greeted: false,
            shared,
        })
    }

    /// (open connections, of which without hello, sessions evicted still closing).
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize, usize) {
        let t = lock(&self.table);
        (t.total(), t.pending, t.leaving)
    }

    fn publish(&self, t: &Table) {
        // Slots held: an evicted session still closing holds none.
        self.stats
            .connections
            .store(t.total() as u64, Ordering::Relaxed);
    }
}

/// One connection's slot; given back when dropped.
pub struct Slot {
    admission: Arc<Admission>,
    uid: u32,
    id: u64,
    greeted: bool,
    shared: Arc<Shared>,
}

impl Slot {
    /// Takes a session slot for the hello about to be applied; waits while sessions evicted to
    /// make room are still closing. Err: this connection was evicted, and must not open one.
    pub async fn claim(&mut self) -> Result<(), Eviction> {
        if self.greeted {
            return Ok(());
        }
        loop {
            let closed = self.admission.closed.notified();
            tokio::pin!(closed);
            // Registered before the look, so a close between the two is not missed.
            closed.as_mut().enable();
            let claim = {
                let mut t = lock(&self.admission.table);
                let c = t.claim(self.uid, self.id, &self.shared);
                self.admission.publish(&t);
                c
            };
            match claim {
                Claim::Taken => {
                    self.greeted = true;
                    return Ok(());
                }
                Claim::Evicted(why) => return Err(why),
                Claim::Wait => {}
            }
            tokio::select! {
                _ = closed => {}
                _ = self.shared.evict.cancelled() => {}
            }
        }
    }

    /// The hello taken for was refused: the connection is back to waiting for one.
    pub fn unclaim(&mut self) {
        if !self.greeted {
            return;
        }
        self.greeted = false;
        let mut t = lock(&self.admission.table);
        t.unclaim(self.uid, self.id);
        self.admission.publish(&t);
    }

    pub fn greeted(&self) -> bool {
        self.greeted
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Why the connection was evicted, if it was.
    pub fn evicted_now(&self) -> Option<Eviction> {
        self.shared
            .evict
            .is_cancelled()
            .then(|| evicted_for(&self.shared))
    }

    /// The connection sent lines after its hello: it is active, and silent from now.
    pub fn touch(&self) {
        let t = u64::try_from(self.admission.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.shared.last.store(t, Ordering::Relaxed);
        self.shared.active.store(true, Ordering::Relaxed);
    }

    /// Cancelled when the connection is evicted to make room (`evicted_now` says why).
    pub fn eviction(&self) -> CancellationToken {
        self.shared.evict.clone()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = lock(&self.admission.table);
        let closed = t.release(self.uid, self.id, &self.shared);
        self.admission.publish(&t);
        drop(t);
        if closed {
            self.admission.closed.notify_waiters();
        }
    }
}

/// The table stays consistent even if a holder panicked: every update is a few integer and map
/// operations that cannot panic halfway in a way that matters, so a poisoned lock is used as is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
