use super::*;

#[test]
fn drops_and_counts_the_oldest_and_never_allocates_past_capacity() {
    for cap in [1, 3, 64, 300, 4096] {
        let mut q = Bounded::new(cap);
        for i in 0..cap + 10 {
            let out = q.push(i);
            assert_eq!(out, (i >= cap).then(|| i - cap));
            assert!(q.allocated() <= cap, "{cap}: {} slots", q.allocated());
        }
        assert_eq!(q.len(), cap);
        assert_eq!(q.dropped(), 10);
        assert_eq!(q.iter().next(), Some(&10));
        assert_eq!(q.back(), Some(&(cap + 9)));
    }
}

#[test]
fn drain_takes_everything_in_order() {
    let mut q = Bounded::new(3);
    for i in 0..5 {
        q.push(i);
    }
    assert_eq!(q.drain().collect::<Vec<_>>(), [2, 3, 4]);
    assert!(q.is_empty());
    assert_eq!(q.dropped(), 2);
}
