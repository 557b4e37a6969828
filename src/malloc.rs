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

/// How often a due trim is done.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Set when a lot of memory was freed below the top of the heap.
static TRIM_DUE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that memory a burst needed was freed (a connection's buffers after its history came
/// in), so the next trim is worth doing.
pub fn burst_freed() {
    TRIM_DUE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// glibc gives memory back to the system only from the top of each arena. What is freed below
/// it (the buffers 64 trainers' history bursts grew) stays resident until `malloc_trim`, which
/// returns every whole free page. Done only after a burst, at most every 10 s: trimming the
/// steady churn of polls and scrapes as well made RSS swing by up to 1 MiB as it grew back.
pub async fn give_back_free_pages() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if !TRIM_DUE.swap(false, std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim takes each arena's lock itself; it is safe from any thread.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
