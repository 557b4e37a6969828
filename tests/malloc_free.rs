//! The trim trigger sees memory freed below the top of the heap (src/malloc.rs). A file of its
//! own: the test runs alone in its process, so no other test's allocations take the freed
//! memory back before it is measured.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn memory_freed_below_the_top_is_seen() {
    let before = gpumon::malloc::free_below_top();
    // Below the mmap threshold, so carved from the heap; the live block after them keeps the
    // freed ones from being the top.
    let blocks: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 64 * 1024]).collect();
    let pin = vec![2u8; 1024];
    drop(blocks);
    let after = gpumon::malloc::free_below_top();
    assert!(
        after >= before + (2 << 20),
        "free below the top {before} -> {after} after freeing 4 MiB under a live block"
    );
    drop(pin);
}
