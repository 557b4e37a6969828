use super::*;

#[tokio::test]
async fn grants_fit_the_budget_and_come_back_on_drop() {
    let b = LineBudget::new(100);
    let (mut g1, mut g2) = (None, None);
    b.resize(&mut g1, 60, || false).await;
    b.resize(&mut g2, 40, || false).await;
    assert_eq!(b.used(), 100);
    // Shrinking gives room back at once.
    b.resize(&mut g1, 10, || false).await;
    assert_eq!(b.used(), 50);
    drop(g2);
    assert_eq!(b.used(), 10);
    drop(g1);
    assert_eq!(b.used(), 0);
}

#[tokio::test]
async fn a_waiter_gets_room_when_a_holder_finishes() {
    let b = LineBudget::new(100);
    let mut holder = None;
    b.resize(&mut holder, 100, || false).await;
    let b2 = b.clone();
    let waiter = tokio::spawn(async move {
        let mut g = None;
        b2.resize(&mut g, 50, || false).await;
        g
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished());
    // Still progressing: not stale, not reclaimed.
    holder.as_ref().unwrap().progressed();
    b.resize(&mut holder, 50, || false).await;
    let g = waiter.await.unwrap();
    assert!(g.is_some());
    assert_eq!(b.used(), 100);
    assert_eq!(b.reclaimed(), 0);
}

#[tokio::test]
async fn a_waiter_whose_line_is_whole_is_not_taken_while_an_idle_holder_can_give_way() {
    let b = LineBudget::new(100);
    let (mut trainer, mut idle) = (None, None);
    b.resize(&mut trainer, 30, || false).await;
    b.resize(&mut idle, 70, || false).await;
    // The trainer needs room for the rest of a line already in its socket; a newcomer
    // (nothing held) needs room too.
    let b2 = b.clone();
    let waiting = tokio::spawn(async move {
        b2.resize(&mut trainer, 60, || true).await;
        trainer
    });
    let b3 = b.clone();
    let newcomer = tokio::spawn(async move {
        let mut g = None;
        b3.resize(&mut g, 40, || false).await;
        g
    });
    // The idle holder finishes a line half-way: when the trainer has waited `STALE`, the
    // idle one is not stale yet. The trainer must not be taken in the meantime.
    tokio::time::sleep(STALE / 2).await;
    let idle_g = idle.take().unwrap();
    idle_g.progressed();
    tokio::time::sleep(STALE + Duration::from_millis(250)).await;
    tokio::time::timeout(Duration::from_millis(10), idle_g.reclaimed())
        .await
        .expect("the idle holder gives way once stale");
    drop(idle_g);
    let trainer = waiting.await.unwrap();
    assert!(!trainer.as_ref().unwrap().is_reclaimed());
    assert_eq!(b.reclaimed(), 1);
    assert!(newcomer.await.unwrap().is_some());
}

#[tokio::test]
async fn holders_all_waiting_on_each_other_do_not_hold_the_budget_for_good() {
    let b = LineBudget::new(100);
    let (mut a, mut c) = (None, None);
    b.resize(&mut a, 50, || true).await;
    b.resize(&mut c, 50, || true).await;
    let b2 = b.clone();
    let first = tokio::spawn(async move {
        b2.resize(&mut a, 60, || true).await;
        a
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b3 = b.clone();
    let second = tokio::spawn(async move {
        b3.resize(&mut c, 60, || true).await;
        c
    });
    let (a, c) = tokio::time::timeout(STALE * 3, async {
        (first.await.unwrap(), second.await.unwrap())
    })
    .await
    .expect("one of them gives way");
    // The one that waited longest went; the other got its room.
    assert!(a.as_ref().unwrap().is_reclaimed());
    assert_eq!(c.as_ref().unwrap().holder.bytes.load(Ordering::Relaxed), 60);
}

#[tokio::test]
async fn a_stale_holder_is_reclaimed_idle_before_waiting() {
    let b = LineBudget::new(100);
    let (mut idle, mut busy) = (None, None);
    b.resize(&mut idle, 50, || false).await;
    b.resize(&mut busy, 50, || false).await;
    // `busy` waits for more; both are stale once STALE passes without a line.
    let b2 = b.clone();
    let more = tokio::spawn(async move {
        b2.resize(&mut busy, 60, || false).await;
        busy
    });
    tokio::time::sleep(STALE + Duration::from_millis(200)).await;
    let idle_g = idle.take().unwrap();
    // The idle holder is told to go, not the one waiting.
    tokio::time::timeout(Duration::from_millis(10), idle_g.reclaimed())
        .await
        .expect("the idle stale holder is reclaimed");
    assert_eq!(b.reclaimed(), 1);
    drop(idle_g);
    let busy = more.await.unwrap();
    assert_eq!(
        busy.as_ref().unwrap().holder.bytes.load(Ordering::Relaxed),
        60
    );
    assert_eq!(b.used(), 60);
}
