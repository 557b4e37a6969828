//! Keeps glibc's allocator from holding on to big, short-lived buffers. By default a freed
//! mmap'd block raises the mmap threshold to its size, so after the first 2-4 MB /api/v1/snapshot
//! (64 sessions) every later one is carved from the heap and its pages stay resident: +5 MB of
//! RSS for good. A fixed threshold keeps such buffers mmap'd and gives them back when freed.

/// glibc's default threshold, made fixed.
const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Call once at start, before the runtime's threads exist.
pub fn return_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no other thread is allocating yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// For a process that allocates little, and only at its refresh (the TUI): one arena for all
/// its threads, so the fetch thread's and the resolver threads' allocations do not each keep an
/// arena of free pages beside the main one. Call before the threads start.
pub fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Free memory below the heap's top worth a trim in the TUI: what a whole answer or a burst of
/// trainers' history leaves. A delta answer frees a few hundred KiB that the next refresh
/// takes again: trimming those at each refresh cost 1.6 ms a second in madvise and page faults.
const TUI_TRIM_FROM: u64 = 1 << 20;

/// Gives every whole free page back when over 1 MiB lies free below the heap's top. For the TUI
/// after it applied an answer: the answer's text and its parse are freed by then.
pub fn trim_if_worth_it() {
    if free_below_top() < TUI_TRIM_FROM {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes each arena's lock itself; it is safe from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How often a due trim is done.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Set when a lot of memory was freed below the top of the heap.
static TRIM_DUE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that memory a burst needed was freed (a connection's buffers after its history came
/// in), so the next trim is worth doing.
pub fn burst_freed() {
    TRIM_DUE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Free memory below the tops of the heaps grown by this much since the last trim (or since
/// it was lowest) makes a trim worth doing: what a flood of connections or an expiry of held
/// findings leaves behind, whoever freed it.
const FREED_ENOUGH: u64 = 2 << 20;

/// Bytes the allocator holds free below the tops of its heaps, all arenas together: what only
/// `malloc_trim` can give back. 0 where that cannot be asked.
pub fn free_below_top() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo only reads the allocator's statistics, under each arena's lock.
        // (mallinfo2 would need glibc 2.33; these ints cover what is measured here, < 2 GiB.)
        #[allow(deprecated)]
        let m = unsafe { libc::mallinfo() };
        let free = u64::try_from(m.fordblks).unwrap_or(0);
        free.saturating_sub(u64::try_from(m.keepcost).unwrap_or(0))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    0
}

/// glibc gives memory back to the system only from the top of each arena. What is freed below
/// it (the buffers 64 trainers' history bursts grew, a flood's connections, expired findings)
/// stays resident until `malloc_trim`, which returns every whole free page. Done at most every
/// 10 s, after a burst or once 2 MiB more lie free than after the last trim: trimming the
/// steady churn of polls and scrapes as well made RSS swing by up to 1 MiB as it grew back.
/// A trimmed chunk still counts as free, so the mark is reset to what is free after each trim.
pub async fn give_back_free_pages() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut mark = free_below_top();
    loop {
        every.tick().await;
        let free = free_below_top();
        let due = TRIM_DUE.swap(false, std::sync::atomic::Ordering::Relaxed)
            || free > mark.saturating_add(FREED_ENOUGH);
        mark = mark.min(free);
        if !due {
            continue;
        }
        // Off the runtime's threads: a trim of a fragmented heap takes milliseconds.
        let _ = tokio::task::spawn_blocking(|| {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim takes each arena's lock itself; it is safe from any thread.
            unsafe {
                libc::malloc_trim(0);
            }
        })
        .await;
        mark = free_below_top();
    }
}
