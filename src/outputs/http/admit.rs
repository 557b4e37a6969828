//! Who gives way when `http.connection_limit` connections are open: a new connection is let in
//! by closing one that shows itself least worth keeping, the oldest of its kind first: one that
//! never completed a request (half-open or silent), then one whose output has gone unread (its
//! writes stalled for a second), then one that failed basic auth, then an idle keep-alive, and
//! last one serving a request whose peer address holds more than its share of the slots
//! (`connection_limit` / peers holding slots, the newcomer's included; at least 1); any
//! connection of a peer over its share goes before those of peers within theirs. So a
//! scraper always gets in, however many slow, silent, hostile or busy clients hold slots; the
//! newcomer is refused only when every slot serves a request for a peer within its share. The
//! ingest socket's reserve works the same way (connections without a hello give way first).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// How readily a connection gives way; lower goes first, `None` never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Yield {
    /// No request completed yet: half-open, silent, or still in its TLS handshake. First, as
    /// before these kinds existed: the accept loop stops looking at the first one it finds,
    /// which keeps a half-open flood cheap to shed.
    Unproven,
    /// Its writes have made no progress for a second: the client does not read what it asked
    /// for (e.g. pipelined requests behind a tiny receive buffer).
    UnreadOutput,
    /// A request on it failed basic auth (or was throttled for the failures of its peer).
    AuthFailed,
    /// Has been served, and waits idle between requests.
    Idle,
    /// Serving a request; gives way only when its peer is over its share of the slots.
    OverShare,
}

impl Yield {
    pub const ALL: [Yield; 5] = [
        Yield::Unproven,
        Yield::UnreadOutput,
        Yield::AuthFailed,
        Yield::Idle,
        Yield::OverShare,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Yield::Unproven => "unproven",
            Yield::UnreadOutput => "unread_output",
            Yield::AuthFailed => "auth_failed",
            Yield::Idle => "idle",
            Yield::OverShare => "over_share",
        }
    }
}

/// Something that can say how readily its connection gives way right now; `OverShare` means
/// "busy", and is taken only for a peer over its share.
pub(super) trait Yielding: Send + Sync {
    fn yields(&self) -> Option<Yield>;
}

struct Entry {
    who: Arc<dyn Yielding>,
    peer: IpAddr,
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
    /// Connections in `open` by peer address, kept with it (no count of 0 is kept).
    held: HashMap<IpAddr, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.open.remove(&id)?;
        if let Some(n) = self.held.get_mut(&e.peer) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&e.peer);
            }
        }
        Some(e)
    }
}

/// What `make_room` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// Under the cap: nothing closed.
    Free,
    /// This kind of connection was told to close to make room.
    Evicted(Yield),
    /// Every slot serves a peer within its share: the newcomer is refused.
    Full,
}

impl Admission {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Nothing panics while holding the lock (map operations and `yields`, which itself only
        // reads under its own lock); recover anyway.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection from `peer`; it is told to close through the returned token, and
    /// leaves the table when the guard is dropped, however its task ends.
    pub(super) fn register(
        self: &Arc<Self>,
        who: Arc<dyn Yielding>,
        peer: IpAddr,
    ) -> (CancellationToken, Registered) {
        let evict = CancellationToken::new();
        let mut t = self.table();
        let id = t.next;
        t.next += 1;
        *t.held.entry(peer).or_default() += 1;
        t.open.insert(
            id,
            Entry {
                who,
                peer,
                evict: evict.clone(),
            },
        );
        (evict, Registered(self.clone(), id))
    }

    /// Whether one more connection, from `newcomer`, may come in under `cap`: yes while the
    /// table (connections open and not told to close) holds fewer; else the one that gives way
    /// most readily (the oldest of its kind) is told to close and forgotten, so it is not
    /// chosen twice. An evicted connection counts as open until its task has dropped it, a
    /// moment later: the open count overshoots by at most those. Runs over the whole table,
    /// only when it is full (at most `cap` entries).
    pub(super) fn make_room(&self, cap: usize, newcomer: IpAddr) -> Room {
        let mut t = self.table();
        if t.open.len() < cap {
            return Room::Free;
        }
        let held = &t.held;
        let peers = held.len() + usize::from(!held.contains_key(&newcomer));
        let share = (cap / peers).max(1);
        let anyone_over = held.values().any(|&n| n > share);
        // (within its share, kind, age): a peer over its share gives way before any other.
        let mut best: Option<(bool, Yield, u64)> = None;
        for (id, e) in &t.open {
            let over = held.get(&e.peer).is_some_and(|&n| n > share);
            let y = match e.who.yields() {
                Some(Yield::OverShare) if over => Yield::OverShare,
                Some(Yield::OverShare) | None => continue,
                Some(y) => y,
            };
            // Ids ascend, so the first of each kind seen is its oldest.
            let key = (!over, y, *id);
            if best.is_none_or(|b| (key.0, key.1) < (b.0, b.1)) {
                best = Some(key);
                // Nothing can rank before it: stop looking (a flood's accepts stay cheap).
                if y == Yield::Unproven && over == anyone_over {
                    break;
                }
            }
        }
        match best.and_then(|(_, y, id)| Some((y, t.remove(id)?))) {
            Some((y, e)) => {
                e.evict.cancel();
                Room::Evicted(y)
            }
            None => Room::Full,
        }
    }
}

/// Removes its connection from the table when dropped.
pub(super) struct Registered(Arc<Admission>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.table().remove(self.1);
    }
}

#[cfg(test)]
mod tests;
