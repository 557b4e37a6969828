use super::*;

#[test]
fn a_peer_is_throttled_after_its_burst_and_others_are_not() {
    let t = AuthThrottle::default();
    let (bad, good) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
    for i in 0..BURST as usize {
        assert_eq!(t.take(bad), None, "failure {i}");
    }
    let wait = t.take(bad).expect("throttled after its burst");
    assert!(wait > Duration::ZERO && wait <= REFILL, "{wait:?}");
    for _ in 0..10 {
        assert_eq!(t.take(good), None, "right credentials give their try back");
        t.passed(good);
    }
}

#[test]
fn an_ipv6_host_is_counted_by_its_slash_64() {
    let t = AuthThrottle::default();
    let addr = |last: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]);
    for i in 0..BURST as u16 {
        assert_eq!(t.take(addr(i)), None, "failure {i}");
    }
    // A new address in the same /64 is the same peer.
    assert!(t.take(addr(999)).is_some());
    // Another /64 is another peer; a mapped IPv4 address is that IPv4 peer.
    assert_eq!(
        t.take(IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 1])),
        None
    );
    let v4: IpAddr = "10.1.2.3".parse().unwrap();
    let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
    for _ in 0..BURST as usize {
        assert_eq!(t.take(v4), None);
    }
    assert!(t.take(mapped).is_some());
}

#[test]
fn a_full_table_of_throttled_peers_is_kept_and_newcomers_share_one_bucket() {
    let t = AuthThrottle::with_cap(8);
    let peer = |i: u8| IpAddr::from([10, 0, 1, i]);
    for i in 0..8 {
        for _ in 0..BURST as usize {
            assert_eq!(t.take(peer(i)), None);
        }
    }
    // Full, every peer throttled: none of them gets its burst back...
    assert!(t.take(peer(0)).is_some());
    // ...and newcomers share the overflow bucket: a few get through, then none.
    let through = (100..200u8).filter(|i| t.take(peer(*i)).is_none()).count();
    assert_eq!(through, OVERFLOW_BURST as usize);
    assert!(t.take(peer(3)).is_some(), "the table was not cleared");
}
