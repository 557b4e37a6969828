use super::*;

#[test]
fn one_instance_shares_its_mark_across_connections_per_uid() {
    let r = Resume::default();
    let a = r.mark(1000, Some("c-1"));
    assert!(a.advance(5));
    assert!(!a.advance(5) && !a.advance(3));
    let again = r.mark(1000, Some("c-1"));
    assert_eq!(again.get(), 5);
    assert!(!again.advance(4) && again.advance(6));
    assert_eq!(a.get(), 6);
    // Another user's client with the same instance name has its own mark.
    assert_eq!(r.mark(1001, Some("c-1")).get(), 0);
    // No instance: a mark of its own, never shared.
    let lone = r.mark(1000, None);
    assert!(lone.advance(9));
    assert_eq!(r.mark(1000, None).get(), 0);
}

#[test]
fn the_table_stays_bounded_and_keeps_marks_in_use() {
    let r = Resume::default();
    let held = r.mark(1, Some("held"));
    held.advance(77);
    for i in 0..MAX_INSTANCES * 2 {
        r.mark(2, Some(&format!("gone-{i}")));
    }
    assert!(r.len() <= MAX_INSTANCES);
    assert_eq!(r.mark(1, Some("held")).get(), 77);
}
