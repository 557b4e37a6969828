use super::*;

#[test]
fn findings_log_a_burst_then_count_the_rest() {
    let mut l = LogLimit::new("finding");
    let allowed = (0..100)
        .filter(|i| l.allow(1000.0 + *i as f64 / 100.0))
        .count();
    assert_eq!(allowed, BURST as usize);
    assert_eq!(l.suppressed(), 100 - u64::from(BURST));
    // The next interval has its burst again.
    assert!(l.allow(1000.0 + INTERVAL));
    assert_eq!(l.suppressed(), 100 - u64::from(BURST));
}
