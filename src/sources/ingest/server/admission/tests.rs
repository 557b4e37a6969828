use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::*;

fn table(max_connections: usize, max_per_uid: usize, reserved: usize) -> Arc<Admission> {
    let caps = Caps {
        max_connections,
        max_per_uid,
        reserved,
    };
    Admission::new(caps, Arc::new(IngestStats::default()))
}

/// Says hello on `slot` (outside a runtime: claims never wait in these tests).
fn greet(slot: &mut Slot) -> Result<(), Eviction> {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(slot.claim())
}

/// Says hello on `slot`, waiting at most 50 ms: None while sessions evicted for it close.
fn try_greet(slot: &mut Slot) -> Option<Result<(), Eviction>> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(async { tokio::time::timeout(Duration::from_millis(50), slot.claim()).await })
        .ok()
}

fn evicted(s: &Slot) -> bool {
    s.eviction().is_cancelled()
}

#[test]
fn a_uid_at_its_cap_evicts_its_own_oldest_silent_connection() {
    let a = table(100, 3, 0);
    let mut held: Vec<Slot> = (0..3).map(|_| a.admit(1000).unwrap()).collect();
    let other = a.admit(2000).unwrap();
    let newest = a.admit(1000).unwrap();
    // The oldest of uid 1000 made room; uid 2000's connection was not touched.
    assert_eq!(held[0].evicted_now(), Some(Eviction::PerUid));
    assert!(!evicted(&held[1]) && !evicted(&other));
    assert_eq!(a.counts(), (4, 4, 0));
    // Its task closing gives back nothing more: the slot was freed at eviction.
    drop(held.remove(0));
    assert_eq!(a.counts(), (4, 4, 0));
    drop(newest);
    assert_eq!(a.counts(), (3, 3, 0));
}

#[test]
fn a_uid_whose_connections_all_said_hello_is_refused_and_others_are_not() {
    let a = table(100, 2, 0);
    let mut held: Vec<Slot> = (0..2).map(|_| a.admit(1000).unwrap()).collect();
    for s in &mut held {
        greet(s).unwrap();
    }
    assert_eq!(a.admit(1000).err(), Some(Refusal::PerUid));
    assert!(a.admit(2000).is_ok(), "another user still gets in");
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
    assert_eq!(a.counts(), (6, 6, 0));
    // The next silent connection (any user) evicts the oldest of the user holding the most.
    let _next = a.admit(1000).unwrap();
    assert_eq!(flood[0].evicted_now(), Some(Eviction::Pending));
    assert!(!evicted(&trainer));
    assert_eq!(a.counts(), (6, 6, 0));
}

#[test]
fn a_user_over_its_fair_share_gives_a_session_to_a_user_under_it() {
    let a = table(4, 100, 1);
    let mut heavy: Vec<Slot> = (0..3).map(|_| a.admit(1).unwrap()).collect();
    for s in &mut heavy {
        greet(s).unwrap();
    }
    let silent = a.admit(2).unwrap();
    // Full, but one is silent: it makes room, and no session is touched.
    let mut newcomer = a.admit(3).unwrap();
    assert_eq!(silent.evicted_now(), Some(Eviction::Pending));
    assert!(heavy.iter().all(|s| !evicted(s)));
    greet(&mut newcomer).unwrap();
    assert_eq!(a.counts(), (4, 0, 0));
    // Every slot said hello. Two users: a share of 2. Uid 1 holds 3, uid 3 holds 1.
    heavy[0].touch();
    heavy[2].touch();
    let mut second = a.admit(3).unwrap();
    assert!(heavy.iter().all(|s| !evicted(s)), "not before its hello");
    assert_eq!(
        a.counts(),
        (5, 1, 0),
        "one waits for its hello beyond the cap"
    );
    assert_eq!(
        try_greet(&mut second),
        None,
        "its hello waits for the evicted one"
    );
    let share = Share {
        held: 3,
        share: 2,
        users: 2,
    };
    // The quiet one (no line after its hello) went, not the older active one.
    assert!(matches!(
        heavy[1].evicted_now(),
        Some(Eviction::Fair { share: s, active: false, .. }) if s == share
    ));
    assert!(!evicted(&heavy[0]) && !evicted(&heavy[2]));
    let _ = &heavy;
    assert_eq!(a.counts(), (4, 1, 1), "its session still closing counts");
    drop(heavy.remove(1));
    greet(&mut second).unwrap();
    // Uid 3 now holds its share: one more is refused, naming it.
    let full = Refusal::Full(Share {
        held: 2,
        share: 2,
        users: 2,
    });
    assert_eq!(a.admit(3).err(), Some(full));
    // And uid 1, at its share too, cannot take one back.
    assert!(matches!(a.admit(1).err(), Some(Refusal::Full(_))));
}

#[test]
fn among_active_sessions_the_one_silent_longest_gives_way() {
    let a = table(3, 100, 0);
    let mut s: Vec<Slot> = (0..3).map(|_| a.admit(1).unwrap()).collect();
    for x in &mut s {
        greet(x).unwrap();
        x.touch();
    }
    std::thread::sleep(Duration::from_millis(20));
    s[0].touch();
    s[2].touch();
    let mut n = a.admit(2).unwrap();
    assert!(s.iter().all(|x| !evicted(x)));
    assert_eq!(try_greet(&mut n), None);
    match s[1].evicted_now() {
        Some(Eviction::Fair {
            active: true,
            silent_ms,
            ..
        }) => assert!(silent_ms >= 15, "{silent_ms}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn root_and_every_uid_are_treated_alike() {
    // Four users fill the table with quiet sessions; root, a fifth, still gets in.
    let a = table(8, 100, 0);
    let mut all = Vec::new();
    for uid in [20001, 20002, 20003, 20004] {
        for _ in 0..2 {
            let mut s = a.admit(uid).unwrap();
            greet(&mut s).unwrap();
            all.push(s);
        }
    }
    // Share 8 / 5 = 1: every user holds 2, so the lowest uid's oldest quiet session goes.
    let mut root = a.admit(0).unwrap();
    assert!(all.iter().all(|s| !evicted(s)), "not before its hello");
    // Its hello evicts; that session's task has not closed it yet: root's hello waits for it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let waiting = tokio::time::timeout(Duration::from_millis(50), root.claim()).await;
        assert!(waiting.is_err(), "the cap holds while it closes");
    });
    assert!(evicted(&all[0]) && all[1..].iter().all(|s| !evicted(s)));
    // Waiting again evicts no second session.
    rt.block_on(async {
        let waiting = tokio::time::timeout(Duration::from_millis(50), root.claim()).await;
        assert!(waiting.is_err());
    });
    assert!(all[1..].iter().all(|s| !evicted(s)), "one per hello");
    drop(all.remove(0));
    rt.block_on(async {
        let claim = tokio::time::timeout(Duration::from_secs(5), root.claim()).await;
        assert_eq!(claim.unwrap(), Ok(()));
    });
    assert_eq!(a.counts(), (8, 0, 0));
}

#[test]
fn connects_without_hello_never_evict_a_session() {
    // Every slot said hello; uid 1 holds 3 of 4, over its share. An attacker (uid 66) connects
    // over and over and never says hello: each connect evicts only its own previous one.
    let a = table(4, 100, 1);
    let heavy: Vec<Slot> = (0..3)
        .map(|_| {
            let mut s = a.admit(1).unwrap();
            greet(&mut s).unwrap();
            s
        })
        .collect();
    let mut other = a.admit(2).unwrap();
    greet(&mut other).unwrap();
    let mut conns = Vec::new();
    for _ in 0..20 {
        conns.push(a.admit(66).unwrap());
        assert!(heavy.iter().all(|s| !evicted(s)) && !evicted(&other));
        assert_eq!(a.counts(), (5, 1, 0), "at most one beyond the cap");
    }
    let (last, earlier) = conns.split_last().unwrap();
    assert!(earlier
        .iter()
        .all(|c| c.evicted_now() == Some(Eviction::Pending)));
    assert!(!evicted(last));
    // A newcomer with a hello still gets its fair slot: its hello evicts uid 1's quietest.
    let mut trainer = a.admit(3).unwrap();
    assert_eq!(last.evicted_now(), Some(Eviction::Pending));
    assert!(heavy.iter().all(|s| !evicted(s)));
    assert_eq!(try_greet(&mut trainer), None);
    assert_eq!(heavy.iter().filter(|s| evicted(s)).count(), 1);
    assert!(!evicted(&other));
}

#[test]
fn a_hello_after_its_eviction_opens_no_session() {
    let a = table(2, 100, 0);
    let mut first = a.admit(1).unwrap();
    let _second = a.admit(1).unwrap();
    let _third = a.admit(1).unwrap();
    // Its hello arrives after the eviction: refused, so the cap is never exceeded.
    assert_eq!(greet(&mut first), Err(Eviction::Pending));
    assert!(!first.greeted());
    assert_eq!(a.counts(), (2, 2, 0));
    drop(first);
    assert_eq!(a.counts(), (2, 2, 0));
}

#[test]
fn a_refused_hello_leaves_the_connection_waiting_again() {
    let a = table(1, 100, 0);
    let mut s = a.admit(1).unwrap();
    greet(&mut s).unwrap();
    s.unclaim();
    assert!(!s.greeted());
    assert_eq!(a.counts(), (1, 1, 0));
    let _n = a.admit(2).unwrap();
    assert_eq!(s.evicted_now(), Some(Eviction::Pending));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_hellos_from_five_users_never_exceed_the_cap() {
    const CAP: usize = 64;
    let a = table(CAP, 1000, 4);
    let open = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..5 * 40 {
        let (a, open, most) = (a.clone(), open.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut slot) = a.admit(20001 + (i % 5) as u32) else {
                return;
            };
            tokio::task::yield_now().await;
            if slot.claim().await.is_err() {
                return;
            }
            // A session is open from its claim until its slot is dropped.
            let n = open.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            let token = slot.eviction();
            let _ = tokio::time::timeout(Duration::from_millis(200), token.cancelled()).await;
            open.fetch_sub(1, Ordering::SeqCst);
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .unwrap()
            .unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=CAP).contains(&most), "{most} sessions open at once");
    assert_eq!(a.counts(), (0, 0, 0));
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
    assert!(a.counts() == (0, 0, 0) && lock(&a.table).uids.is_empty());
}

#[tokio::test]
async fn a_panicking_connection_task_gives_its_slot_back() {
    let a = table(1, 1, 0);
    let mut slot = a.admit(1).unwrap();
    slot.claim().await.unwrap();
    let task = tokio::spawn(async move {
        let _slot = slot;
        panic!("a handler bug");
    });
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(a.counts(), (0, 0, 0));
    assert!(a.admit(1).is_ok(), "the slot is usable again");
}
