use super::*;

#[test]
fn varints_and_deltas_round_trip_at_the_edges() {
    let edges = [
        0,
        1,
        -1,
        63,
        -64,
        64,
        512,
        -512,
        513,
        i64::MAX,
        i64::MIN,
        1 << 50,
    ];
    for v in edges {
        let mut b = Vec::new();
        put(&mut b, zigzag(v));
        put(&mut b, delta(v));
        let mut at = 0;
        assert_eq!(unzigzag(get(&b, &mut at)), v);
        assert_eq!(undelta(get(&b, &mut at)), v);
        assert_eq!(at, b.len());
    }
    // A change in whole 512-byte blocks takes fewer bytes than one that is not.
    let len = |d| {
        let mut b = Vec::new();
        put(&mut b, delta(d));
        b.len()
    };
    assert_eq!((len(4 << 20), len((4 << 20) + 1)), (3, 4));
}
