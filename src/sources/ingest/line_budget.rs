//! One budget for the bytes all connections buffer past their first 4 KiB (`BASE`): the 16 KiB
//! reads of a burst, and lines longer than the base (up to the 64 KiB cap) grow a connection's
//! buffer only with a grant from it. Without it, 1,024 connections each holding an unfinished
//! 64 KiB line made the daemon hold 90 MB.
//!
//! When the budget is spent, a connection that needs more waits (it stops reading, so its
//! client is held back by its socket buffer), and the oldest holder that has finished no line
//! for `STALE` (a slowloris, or a client that stopped mid-line) is told to give its grant back:
//! that connection is closed if it holds an unfinished line, else it only gives its big buffer
//! back and reads on. A trainer writes a line in one go, so no trainer is closed this way; only
//! a client sitting on an unfinished line is, the idle first. A waiter whose socket already
//! holds the end of its line (it wrote the line whole, and needs only room to read it) is never
//! taken while anyone else could be: only when every holder is waiting for more (none could
//! finish and give room back) is the longest waiter taken, whatever it is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::stats::IngestStats;

/// Bytes of a connection's buffer that need no grant: what a trainer keeping up reads with.
pub const BASE: usize = 4 * 1024;
/// A holder that has finished no line for this long may be reclaimed by a connection waiting.
pub const STALE: Duration = Duration::from_secs(1);
/// A waiter looks again this often, in case the oldest holder just turned stale.
const RECHECK: Duration = Duration::from_millis(100);
const NOT_WAITING: u64 = u64::MAX;

pub struct LineBudget {
    max: usize,
    state: Mutex<State>,
    freed: Notify,
    epoch: Instant,
    /// Grants taken back from stale holders.
    reclaimed: AtomicU64,
    /// Where bytes granted are published (gpumon_ingest_line_buffer_bytes).
    stats: Option<Arc<IngestStats>>,
}

#[derive(Default)]
struct State {
    used: usize,
    next_id: u64,
    holders: HashMap<u64, Arc<Holder>>,
}

struct Holder {
    bytes: AtomicU64,
    /// When the holder last finished a line (ms since `epoch`), or got its grant.
    progress_ms: AtomicU64,
    /// Since when the holder waits for more (ms since `epoch`), or `NOT_WAITING`.
    waiting_since_ms: AtomicU64,
    /// While waiting: the end of its line is already in its socket (see `resize`).
    line_queued: AtomicBool,
    reclaim: Notify,
    reclaimed: AtomicBool,
}

/// A connection's share of the budget; given back when dropped.
pub struct Grant {
    budget: Arc<LineBudget>,
    id: u64,
    holder: Arc<Holder>,
}

impl LineBudget {
    pub fn new(max: usize) -> Arc<Self> {
        Self::build(max, None)
    }

    /// A budget whose bytes granted show in `stats`.
    pub fn reporting(max: usize, stats: Arc<IngestStats>) -> Arc<Self> {
        Self::build(max, Some(stats))
    }

    fn build(max: usize, stats: Option<Arc<IngestStats>>) -> Arc<Self> {
        Arc::new(Self {
            max,
            state: Mutex::new(State::default()),
            freed: Notify::new(),
            epoch: Instant::now(),
            reclaimed: AtomicU64::new(0),
            stats,
        })
    }

    fn publish(&self, used: usize) {
        if let Some(s) = &self.stats {
            s.line_buffer_bytes.store(used as u64, Ordering::Relaxed);
        }
    }

    /// Bytes granted now, all connections together.
    pub fn used(&self) -> usize {
        self.lock().used
    }

    /// Grants taken back from connections that sat on an unfinished line.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while the lock is held leaves plain counters behind: still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Makes `grant` hold `bytes` (taking a grant first if there is none), waiting while the
    /// budget has no room. Room is taken from stale holders at once: their bytes pass to this
    /// grant as they are told to go (their buffers are freed a moment later, as they close).
    /// `line_queued` says whether the rest of the caller's line is already in its socket; it is
    /// asked once, when the caller first has to wait (a peek costs a copy).
    pub async fn resize(
        self: &Arc<Self>,
        grant: &mut Option<Grant>,
        bytes: usize,
        line_queued: impl FnOnce() -> bool,
    ) {
        let mut line_queued = Some(line_queued);
        loop {
            if grant.as_ref().is_some_and(Grant::is_reclaimed) {
                // Told to go: it gets nothing more, and closes.
                return;
            }
            let wait = self.freed.notified();
            tokio::pin!(wait);
            // Registered before the check, so a release between the two is not missed.
            wait.as_mut().enable();
            {
                let mut st = self.lock();
                let held = grant
                    .as_ref()
                    .map_or(0, |g| g.holder.bytes.load(Ordering::Relaxed) as usize);
                let me = grant.as_ref().map(|g| g.id);
                while bytes > held && st.used - held + bytes > self.max {
                    if !self.reclaim_stale(&mut st, me) {
                        break;
                    }
                }
                if bytes <= held || st.used - held + bytes <= self.max {
                    st.used = st.used - held + bytes;
                    let now = self.now_ms();
                    let g = grant.get_or_insert_with(|| {
                        let id = st.next_id;
                        st.next_id += 1;
                        let holder = Arc::new(Holder {
                            bytes: AtomicU64::new(0),
                            progress_ms: AtomicU64::new(now),
                            waiting_since_ms: AtomicU64::new(NOT_WAITING),
                            line_queued: AtomicBool::new(false),
                            reclaim: Notify::new(),
                            reclaimed: AtomicBool::new(false),
                        });
                        st.holders.insert(id, holder.clone());
                        Grant {
                            budget: self.clone(),
                            id,
                            holder,
                        }
                    });
                    g.holder.bytes.store(bytes as u64, Ordering::Relaxed);
                    g.holder
                        .waiting_since_ms
                        .store(NOT_WAITING, Ordering::Relaxed);
                    g.holder.line_queued.store(false, Ordering::Relaxed);
                    if bytes > held {
                        // Given what it asked for: its clock starts again.
                        g.holder.progress_ms.store(now, Ordering::Relaxed);
                    }
                    self.publish(st.used);
                    if bytes < held {
                        self.freed.notify_waiters();
                    }
                    return;
                }
                if let Some(g) = grant.as_ref() {
                    let now = self.now_ms();
                    let _ = g.holder.waiting_since_ms.compare_exchange(
                        NOT_WAITING,
                        now,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    if let Some(queued) = line_queued.take() {
                        g.holder.line_queued.store(queued(), Ordering::Relaxed);
                    }
                }
            }
            let _ = tokio::time::timeout(RECHECK, wait).await;
        }
    }

    /// Takes the grant of the stalest holder that is not `me`: one that has finished no line
    /// for `STALE` while needing nothing more; else one that has waited longest, past `STALE`,
    /// for the rest of a line its client has not sent; else, only when every other holder is
    /// waiting (so holders all waiting on each other cannot hold the budget for good), the
    /// longest waiter past `STALE`. Its bytes are free for the caller at once; the holder is
    /// told to go. False when none may be taken.
    fn reclaim_stale(&self, st: &mut State, me: Option<u64>) -> bool {
        let Some(stale_before) = self.now_ms().checked_sub(STALE.as_millis() as u64) else {
            return false;
        };
        let others = || {
            st.holders
                .iter()
                .filter(|(id, h)| Some(**id) != me && !h.reclaimed.load(Ordering::Relaxed))
        };
        let all_waiting =
            others().all(|(_, h)| h.waiting_since_ms.load(Ordering::Relaxed) != NOT_WAITING);
        let victim = others()
            .filter_map(|(id, h)| {
                let waiting = h.waiting_since_ms.load(Ordering::Relaxed);
                let (class, since) = if waiting == NOT_WAITING {
                    (0, h.progress_ms.load(Ordering::Relaxed))
                } else if !h.line_queued.load(Ordering::Relaxed) {
                    (1, waiting)
                } else if all_waiting {
                    (2, waiting)
                } else {
                    // Its client wrote the line whole: it needs only room, and an idle holder
                    // will turn stale and give it.
                    return None;
                };
                (since <= stale_before).then_some((class, since, *id))
            })
            .min();
        let Some((_, _, id)) = victim else {
            return false;
        };
        let Some(h) = st.holders.remove(&id) else {
            return false;
        };
        h.reclaimed.store(true, Ordering::Relaxed);
        let bytes = h.bytes.swap(0, Ordering::Relaxed) as usize;
        st.used = st.used.saturating_sub(bytes);
        // A stored permit: the holder sees it even if it is not waiting on it yet.
        h.reclaim.notify_one();
        self.reclaimed.fetch_add(1, Ordering::Relaxed);
        true
    }
}

impl Grant {
    /// The holder finished a line: it is making progress, not sitting on the budget.
    pub fn progressed(&self) {
        let now = self.budget.now_ms();
        self.holder.progress_ms.store(now, Ordering::Relaxed);
    }

    /// The budget took this grant back.
    pub fn is_reclaimed(&self) -> bool {
        self.holder.reclaimed.load(Ordering::Relaxed)
    }

    /// Resolves when the budget wants this grant back; the connection is then closed.
    pub async fn reclaimed(&self) {
        self.holder.reclaim.notified().await;
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let mut st = self.budget.lock();
        // A reclaimed holder is out of the table already, its bytes passed on (now 0).
        st.holders.remove(&self.id);
        st.used = st
            .used
            .saturating_sub(self.holder.bytes.load(Ordering::Relaxed) as usize);
        self.budget.publish(st.used);
        drop(st);
        self.budget.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
