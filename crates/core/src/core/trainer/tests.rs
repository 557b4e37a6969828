use super::*;

fn sample(free: Option<u64>, reserved: Option<u64>, total: Option<u64>) -> Sample {
    Sample {
        ts: 1.0,
        step: Some(1),
        phase: Phase::default(),
        stats: Stats {
            reserved,
            ..Stats::default()
        },
        device_free: free,
        device_total: total,
        alloc_limit: None,
        categories: None,
    }
}

#[test]
fn the_allocator_limit_is_reserved_plus_free_under_the_cap() {
    const G: u64 = 1 << 30;
    let s = sample(Some(10 * G), Some(20 * G), Some(80 * G));
    assert_eq!(s.allocator_limit(None), Some(30 * G));
    assert_eq!(s.allocator_limit(Some(25 * G)), Some(25 * G));
    assert_eq!(s.allocator_limit(Some(40 * G)), Some(30 * G));
    // Without device_free: the device total, under the cap.
    let s = sample(None, Some(20 * G), Some(80 * G));
    assert_eq!(s.allocator_limit(None), Some(80 * G));
    assert_eq!(s.allocator_limit(Some(25 * G)), Some(25 * G));
    // Nothing known but the cap; nothing at all.
    let s = sample(None, None, None);
    assert_eq!(s.allocator_limit(Some(25 * G)), Some(25 * G));
    assert_eq!(s.allocator_limit(None), None);
    // Free plus reserved never overflows.
    let s = sample(Some(u64::MAX), Some(G), None);
    assert_eq!(s.allocator_limit(None), Some(u64::MAX));
}
