use super::*;

fn table(max_connections: usize, max_per_uid: usize, reserved: usize) -> Arc<Admission> {
    let caps = Caps {
        max_connections,
        max_per_uid,
        reserved,
    };
    Admission::new(caps, Arc::new(IngestStats::default()))
}

#[test]
fn a_uid_at_its_cap_evicts_its_own_oldest_silent_connection() {
    let a = table(100, 3, 0);
    let mut held: Vec<Slot> = (0..3).map(|_| a.admit(1000).unwrap()).collect();
    let other = a.admit(2000).unwrap();
    let newest = a.admit(1000).unwrap();
    // The oldest of uid 1000 made room; uid 2000's connection was not touched.
    assert!(held[0].evict.is_cancelled());
    assert_eq!(held[0].evicted_by.get(), Some(&Eviction::PerUid));
    assert!(!held[1].evict.is_cancelled() && !other.evict.is_cancelled());
    assert_eq!(a.counts(), (4, 4));
    // Its task closing gives back nothing more: the slot was freed at eviction.
    drop(held.remove(0));
    assert_eq!(a.counts(), (4, 4));
    drop(newest);
    assert_eq!(a.counts(), (3, 3));
}

#[test]
fn a_uid_whose_connections_all_said_hello_is_refused_and_others_are_not() {
    let a = table(100, 2, 0);
    let mut held: Vec<Slot> = (0..2).map(|_| a.admit(1000).unwrap()).collect();
    for s in &mut held {
        s.greet();
    }
    assert_eq!(a.admit(1000).err(), Some(Refusal::PerUid));
    let other = a.admit(2000);
    assert!(other.is_ok(), "another user still gets in");
    // A slot given back is usable again by the same user.
    drop(held.pop());
    assert!(a.admit(1000).is_ok());
}

#[test]
fn silent_connections_never_take_the_reserve_and_the_heaviest_user_gives_way() {
    // 10 slots, 4 kept back from connections without hello: 6 may wait for hello at once.
    let a = table(10, 100, 4);
    let flood: Vec<Slot> = (0..5).map(|_| a.admit(66).unwrap()).collect();
    let trainer = a.admit(1000).unwrap();
    assert_eq!(a.counts(), (6, 6));
    // The next silent connection (any user) evicts the oldest of the user holding the most.
    let _next = a.admit(1000).unwrap();
    assert!(flood[0].evict.is_cancelled());
    assert_eq!(flood[0].evicted_by.get(), Some(&Eviction::Pending));
    assert!(!trainer.evict.is_cancelled());
    assert_eq!(a.counts(), (6, 6));
}

#[test]
fn a_full_table_of_greeted_connections_refuses_and_a_silent_one_gives_way() {
    let a = table(4, 100, 1);
    let mut greeted: Vec<Slot> = (0..3).map(|_| a.admit(1).unwrap()).collect();
    for s in &mut greeted {
        s.greet();
    }
    let silent = a.admit(2).unwrap();
    assert_eq!(a.counts(), (4, 1));
    // Full, but one is silent: it makes room.
    let mut newcomer = a.admit(3).unwrap();
    assert!(silent.evict.is_cancelled());
    newcomer.greet();
    assert_eq!(a.admit(3).err(), Some(Refusal::Full));
    assert_eq!(a.counts(), (4, 0));
}

#[test]
fn hello_racing_its_eviction_keeps_the_slot_counted() {
    let a = table(2, 100, 0);
    let mut first = a.admit(1).unwrap();
    let _second = a.admit(1).unwrap();
    let _third = a.admit(1).unwrap();
    assert!(first.evict.is_cancelled());
    // Its hello was applied before it saw the eviction: the session is open, so it counts.
    first.greet();
    assert_eq!(a.counts(), (3, 2));
    drop(first);
    assert_eq!(a.counts(), (2, 2));
}

#[test]
fn the_connections_gauge_follows_the_table() {
    let stats = Arc::new(IngestStats::default());
    let caps = Caps {
        max_connections: 8,
        max_per_uid: 8,
        reserved: 0,
    };
    let a = Admission::new(caps, stats.clone());
    let s = a.admit(1).unwrap();
    let t = a.admit(1).unwrap();
    assert_eq!(stats.connections.load(Ordering::Relaxed), 2);
    drop((s, t));
    assert_eq!(stats.connections.load(Ordering::Relaxed), 0);
    assert!(a.counts() == (0, 0) && lock(&a.table).uids.is_empty());
}

#[tokio::test]
async fn a_panicking_connection_task_gives_its_slot_back() {
    let a = table(1, 1, 0);
    let mut slot = a.admit(1).unwrap();
    slot.greet();
    let task = tokio::spawn(async move {
        let _slot = slot;
        panic!("a handler bug");
    });
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(a.counts(), (0, 0));
    assert!(a.admit(1).is_ok(), "the slot is usable again");
}
