use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use super::*;
use crate::core::input::{Close, Closing, Lines, Link};
use crate::core::message::Message;
use crate::core::model::NodeReading;
use crate::core::store::{Collection, HistoryLimits, NvmlStatus};
use crate::core::trainer::{Hello, Peer};

/// What a test makes the aggregator's thread do: wait until the sender goes, or panic (its
/// answer then never comes).
pub(super) enum Probe {
    Hold(std_mpsc::Receiver<()>),
    Panic(oneshot::Sender<u32>),
}

impl Probe {
    pub(super) fn run(self) {
        match self {
            Probe::Hold(wait) => {
                let _ = wait.recv();
            }
            Probe::Panic(answer) => {
                let _ = answer;
                panic!("a bug in one input")
            }
        }
    }
}

fn store() -> Store {
    Store::new(HistoryLimits { gpu_points: 8 }, 1.0, "lib".into())
}

fn no_text(_: &Store) -> String {
    String::new()
}

fn collection(ts: f64) -> Collection {
    let mut status = NvmlStatus::default();
    status.record_ok(ts, 0.001);
    Collection {
        ts,
        reading: Ok(Arc::new(NodeReading {
            ts,
            driver_version: None,
            gpus: vec![],
            processes: vec![],
        })),
        status,
        text: Arc::from(format!("# collection {ts}\n")),
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Holds the aggregator's thread inside an update until the returned sender is dropped.
fn block(h: &Handle) -> std_mpsc::Sender<()> {
    let (gate, wait) = std_mpsc::channel::<()>();
    let h2 = h.clone();
    std::thread::spawn(move || h2.send_blocking(Msg::Test(Probe::Hold(wait))));
    wait_for("the blocking update to start", || {
        h.stats().updates[2].load(Ordering::Relaxed) == 1 && h.queued() == 0
    });
    gate
}

#[test]
fn a_collection_is_published_at_once_with_its_text() {
    let (h, thread) = spawn(store(), no_text, None).unwrap();
    assert!(!h.view().ready());
    assert!(h.offer_collection(collection(5.0)));
    wait_for("the view", || h.view().ready());
    let v = h.view();
    assert_eq!(&*v.gpu_text, "# collection 5\n");
    assert_eq!(v.nvml.polls_total, 1);
    assert_eq!(v.collection, 1);
    drop(h);
    thread.join().unwrap();
}

#[test]
fn collections_offered_to_a_full_queue_are_dropped_and_counted() {
    let (h, thread) = spawn(store(), no_text, None).unwrap();
    let gate = block(&h);
    let extra = 7;
    for i in 0..QUEUE + extra {
        assert!(h.offer_collection(collection(i as f64)));
    }
    let s = h.stats().clone();
    assert_eq!(s.collections_dropped.load(Ordering::Relaxed), extra as u64);
    assert_eq!(h.queued(), QUEUE);
    drop(gate);
    wait_for("the queue to drain", || {
        s.collections.load(Ordering::Relaxed) == QUEUE as u64
    });
    // Every collection that was taken was applied; the counters add up to what was offered.
    assert_eq!(
        s.collections.load(Ordering::Relaxed) + s.collections_dropped.load(Ordering::Relaxed),
        (QUEUE + extra) as u64
    );
    wait_for("the last view", || h.view().collection == QUEUE as u64);
    drop(h);
    thread.join().unwrap();
}

/// A trainer that says hello and vanishes: a crash finding fires when its connection closes.
fn crash(h: &Handle, rt: &tokio::runtime::Runtime, pid: u32) {
    let peer = Peer {
        pid,
        uid: 1000,
        gid: 1000,
    };
    // Each its own job: crashes of one job are reported together.
    let hello = Hello {
        job: Some(format!("j{pid}")),
        rank: Some(0),
        ..Hello::default()
    };
    let mut lines = Box::new(Lines::new(Link::new(peer)));
    lines.now = 1.0;
    lines.messages.push(Message::Hello(hello));
    let out = rt.block_on(h.apply(Input::Lines(lines))).unwrap();
    let link = out.into_lines().unwrap().link;
    let close = Close {
        link,
        how: Closing::Crash,
        now: 2.0,
    };
    rt.block_on(h.apply(Input::Close(close))).unwrap();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

#[test]
fn transitions_the_alert_thread_cannot_take_are_dropped_and_counted() {
    let (tx, rx) = std_mpsc::sync_channel(3);
    let (h, thread) = spawn(store(), no_text, Some(tx)).unwrap();
    let crashes = 10;
    let rt = runtime();
    for pid in 0..crashes {
        crash(&h, &rt, 100 + pid);
    }
    let fired = match h.query_blocking(Query::Firing) {
        Some(Answer::Firing(f)) => f.len(),
        _ => panic!("no answer"),
    };
    assert_eq!(fired, crashes as usize);
    // No one reads the alert channel: three fit, the rest were dropped, and counted.
    wait_for("the count", || {
        h.stats().alerts_dropped.load(Ordering::Relaxed) == crashes as u64 - 3
    });
    let got: Vec<Finding> = rx.try_iter().collect();
    assert_eq!(got.len(), 3);
    assert!(got
        .iter()
        .all(|f| f.kind == crate::core::detect::Kind::Crash));
    drop(h);
    thread.join().unwrap();
}

fn live_sessions(h: &Handle) -> Option<usize> {
    match h.query_blocking(Query::Local {
        hostname: "h".into(),
    })? {
        Answer::Local(_, snap) => Some(snap.sessions.len()),
        _ => None,
    }
}

#[test]
fn an_input_that_panics_is_dropped_and_the_aggregator_goes_on() {
    let (h, thread) = spawn(store(), no_text, None).unwrap();
    let (answer, lost) = oneshot::channel();
    assert!(h.send_blocking(Msg::Test(Probe::Panic(answer))));
    let lost = lost.blocking_recv().ok();
    assert_eq!(lost, None);
    wait_for("the panic to be counted", || {
        h.stats().panics.load(Ordering::Relaxed) == 1
    });
    let next = live_sessions(&h);
    assert_eq!(next, Some(0));
    drop(h);
    thread.join().unwrap();
}

#[test]
fn stop_applies_what_is_queued_and_then_ends_whoever_holds_a_handle() {
    let (h, thread) = spawn(store(), no_text, None).unwrap();
    let gate = block(&h);
    for i in 0..5 {
        h.offer_collection(collection(i as f64));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let stopper = h.clone();
    let stopping = std::thread::spawn(move || rt.block_on(stopper.stop()));
    wait_for("the stop to be queued", || h.queued() == 6);
    drop(gate);
    stopping.join().unwrap();
    thread.join().unwrap();
    assert_eq!(h.stats().collections.load(Ordering::Relaxed), 5);
    assert_eq!(h.view().collection, 5);
    // `h` is still held, and yet the aggregator is gone: later inputs are refused.
    assert!(h.query_blocking(Query::Firing).is_none());
    assert!(!h.offer_collection(collection(9.0)));
}

static ENCODES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn counted_text(s: &Store) -> String {
    ENCODES.fetch_add(1, Ordering::Relaxed);
    s.generation().to_string()
}

#[test]
fn scrapes_in_a_tight_loop_cost_at_most_one_encode_per_publish_gap() {
    let (h, _t) = spawn(store(), counted_text, None).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let started = Instant::now();
    let before = ENCODES.load(Ordering::Relaxed);
    for n in 1..=300u64 {
        assert!(h.offer_collection(collection(n as f64)));
        rt.block_on(h.sync());
        // Held or not, a sync returns only once the view has what came before it.
        assert_eq!(&*h.view().trainer_text, n.to_string().as_str());
    }
    let encodes = ENCODES.load(Ordering::Relaxed) - before;
    let gaps = (started.elapsed().as_secs_f64() / PUBLISH_GAP.as_secs_f64()).ceil() as usize;
    assert!(encodes <= gaps + 1, "{encodes} encodes in {gaps} gaps");
}
