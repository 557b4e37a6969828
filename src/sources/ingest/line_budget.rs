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
mod tests {
    use super::*;

    #[tokio::test]
    async fn grants_fit_the_budget_and_come_back_on_drop() {
        let b = LineBudget::new(100);
        let (mut g1, mut g2) = (None, None);
        b.resize(&mut g1, 60, || false).await;
        b.resize(&mut g2, 40, || false).await;
        assert_eq!(b.used(), 100);
        // Shrinking gives room back at once.
        b.resize(&mut g1, 10, || false).await;
        assert_eq!(b.used(), 50);
        drop(g2);
        assert_eq!(b.used(), 10);
        drop(g1);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn a_waiter_gets_room_when_a_holder_finishes() {
        let b = LineBudget::new(100);
        let mut holder = None;
        b.resize(&mut holder, 100, || false).await;
        let b2 = b.clone();
        let waiter = tokio::spawn(async move {
            let mut g = None;
            b2.resize(&mut g, 50, || false).await;
            g
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        // Still progressing: not stale, not reclaimed.
        holder.as_ref().unwrap().progressed();
        b.resize(&mut holder, 50, || false).await;
        let g = waiter.await.unwrap();
        assert!(g.is_some());
        assert_eq!(b.used(), 100);
        assert_eq!(b.reclaimed(), 0);
    }

    #[tokio::test]
    async fn a_waiter_whose_line_is_whole_is_not_taken_while_an_idle_holder_can_give_way() {
        let b = LineBudget::new(100);
        let (mut trainer, mut idle) = (None, None);
        b.resize(&mut trainer, 30, || false).await;
        b.resize(&mut idle, 70, || false).await;
        // The trainer needs room for the rest of a line already in its socket; a newcomer
        // (nothing held) needs room too.
        let b2 = b.clone();
        let waiting = tokio::spawn(async move {
            b2.resize(&mut trainer, 60, || true).await;
            trainer
        });
        let b3 = b.clone();
        let newcomer = tokio::spawn(async move {
            let mut g = None;
            b3.resize(&mut g, 40, || false).await;
            g
        });
        // The idle holder finishes a line half-way: when the trainer has waited `STALE`, the
        // idle one is not stale yet. The trainer must not be taken in the meantime.
        tokio::time::sleep(STALE / 2).await;
        let idle_g = idle.take().unwrap();
        idle_g.progressed();
        tokio::time::sleep(STALE + Duration::from_millis(250)).await;
        tokio::time::timeout(Duration::from_millis(10), idle_g.reclaimed())
            .await
            .expect("the idle holder gives way once stale");
        drop(idle_g);
        let trainer = waiting.await.unwrap();
        assert!(!trainer.as_ref().unwrap().is_reclaimed());
        assert_eq!(b.reclaimed(), 1);
        assert!(newcomer.await.unwrap().is_some());
    }

    #[tokio::test]
    async fn holders_all_waiting_on_each_other_do_not_hold_the_budget_for_good() {
        let b = LineBudget::new(100);
        let (mut a, mut c) = (None, None);
        b.resize(&mut a, 50, || true).await;
        b.resize(&mut c, 50, || true).await;
        let b2 = b.clone();
        let first = tokio::spawn(async move {
            b2.resize(&mut a, 60, || true).await;
            a
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let b3 = b.clone();
        let second = tokio::spawn(async move {
            b3.resize(&mut c, 60, || true).await;
            c
        });
        let (a, c) = tokio::time::timeout(STALE * 3, async {
            (first.await.unwrap(), second.await.unwrap())
        })
        .await
        .expect("one of them gives way");
        // The one that waited longest went; the other got its room.
        assert!(a.as_ref().unwrap().is_reclaimed());
        assert_eq!(c.as_ref().unwrap().holder.bytes.load(Ordering::Relaxed), 60);
    }

    #[tokio::test]
    async fn a_stale_holder_is_reclaimed_idle_before_waiting() {
        let b = LineBudget::new(100);
        let (mut idle, mut busy) = (None, None);
        b.resize(&mut idle, 50, || false).await;
        b.resize(&mut busy, 50, || false).await;
        // `busy` waits for more; both are stale once STALE passes without a line.
        let b2 = b.clone();
        let more = tokio::spawn(async move {
            b2.resize(&mut busy, 60, || false).await;
            busy
        });
        tokio::time::sleep(STALE + Duration::from_millis(200)).await;
        let idle_g = idle.take().unwrap();
        // The idle holder is told to go, not the one waiting.
        tokio::time::timeout(Duration::from_millis(10), idle_g.reclaimed())
            .await
            .expect("the idle stale holder is reclaimed");
        assert_eq!(b.reclaimed(), 1);
        drop(idle_g);
        let busy = more.await.unwrap();
        assert_eq!(
            busy.as_ref().unwrap().holder.bytes.load(Ordering::Relaxed),
            60
        );
        assert_eq!(b.used(), 60);
    }
}
