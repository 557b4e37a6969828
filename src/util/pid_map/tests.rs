use super::*;

#[test]
fn consecutive_pids_spread_over_the_high_bits() {
    let top = |pid: u32| {
        let mut h = PidHasher::default();
        h.write_u32(pid);
        h.finish() >> 57
    };
    let distinct: std::collections::HashSet<u64> = (10_000..10_128).map(top).collect();
    assert!(distinct.len() > 64, "{}", distinct.len());
    let mut m: PidMap<u32> = PidMap::default();
    m.insert(7, 1);
    assert_eq!(m.get(&7), Some(&1));
}
