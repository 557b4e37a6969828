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
