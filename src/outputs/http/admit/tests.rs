use super::*;

struct Fixed(Mutex<Option<Yield>>);

impl Yielding for Fixed {
    fn yields(&self) -> Option<Yield> {
        *self.0.lock().unwrap()
    }
}

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

fn conn(a: &Arc<Admission>, y: Option<Yield>) -> (CancellationToken, Registered) {
    a.register(Arc::new(Fixed(Mutex::new(y))), ip(1))
}

#[test]
fn the_most_hostile_kind_goes_first_oldest_first_never_a_busy_one_within_its_share() {
    let a = Arc::new(Admission::default());
    let (busy, _g0) = conn(&a, Some(Yield::OverShare));
    let (idle_old, _g1) = conn(&a, Some(Yield::Idle));
    let (idle_new, _g2) = conn(&a, Some(Yield::Idle));
    let (unproven_old, _g3) = conn(&a, Some(Yield::Unproven));
    let (unproven_new, _g4) = conn(&a, Some(Yield::Unproven));
    let (failed, _g5) = conn(&a, Some(Yield::AuthFailed));
    let (unread, _g6) = conn(&a, Some(Yield::UnreadOutput));
    let order = [
        &unproven_old,
        &unproven_new,
        &unread,
        &failed,
        &idle_old,
        &idle_new,
    ];
    for (i, expected) in order.iter().enumerate() {
        // One peer holds every slot, the cap's worth: it is within its share.
        let cap = 7 - i;
        assert_ne!(a.make_room(cap, ip(1)), Room::Free, "eviction {i}");
        assert!(expected.is_cancelled(), "eviction {i} chose another");
        assert!(order[i + 1..].iter().all(|t| !t.is_cancelled()));
        assert!(!busy.is_cancelled());
    }
    assert_eq!(
        a.make_room(1, ip(1)),
        Room::Full,
        "a connection serving a request within its share never gives way"
    );
    assert!(!busy.is_cancelled());
}

#[test]
fn a_busy_peer_over_its_share_gives_way_to_another_peer() {
    let a = Arc::new(Admission::default());
    let (mine, _g0) = a.register(Arc::new(Fixed(Mutex::new(Some(Yield::OverShare)))), ip(1));
    let hogs: Vec<_> = (0..3)
        .map(|_| a.register(Arc::new(Fixed(Mutex::new(Some(Yield::OverShare)))), ip(2)))
        .collect();
    // Cap 4, two peers: a share of 2; 127.0.0.2 holds 3, its oldest goes.
    assert_eq!(a.make_room(4, ip(3)), Room::Evicted(Yield::OverShare));
    assert!(hogs[0].0.is_cancelled());
    assert!(!mine.is_cancelled());
    // Two peers with two busy slots each under a cap of 4: neither is over its share.
    let b = Arc::new(Admission::default());
    let _held: Vec<_> = [1, 1, 2, 2]
        .map(|p| b.register(Arc::new(Fixed(Mutex::new(Some(Yield::OverShare)))), ip(p)))
        .into_iter()
        .collect();
    assert_eq!(b.make_room(4, ip(2)), Room::Full);
}

#[test]
fn a_closed_connection_leaves_the_table() {
    let a = Arc::new(Admission::default());
    let (t, g) = conn(&a, Some(Yield::Unproven));
    drop(g);
    assert_eq!(a.make_room(0, ip(1)), Room::Full);
    assert!(!t.is_cancelled());
}
