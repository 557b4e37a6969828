use crate::core::model::{now, NodeReading};
use crate::core::snapshot::{SessionView, Snapshot};
use crate::core::store::sessions::{SessionLimits, Sessions};
use crate::core::store::{HistoryLimits, Store};
use crate::core::trainer::{Ending, Hello, Peer, Sample, Stats};
use crate::frontends::tui::app::merge::window;
use crate::frontends::tui::app::node::{Node, Origin};
use crate::frontends::tui::fixtures;

const GIB: u64 = 1 << 30;

/// A daemon's store: three GPUs polled every second from `t0`, trainers opened on it. GPU 0's
/// processes hold their memory, GPU 1's grow with each poll, GPU 2 has none.
struct Daemon {
    store: Store,
    t0: f64,
    polls: u32,
}

impl Daemon {
    fn new() -> Self {
        let t0 = now() - 200.0;
        let mut store = Store::new(HistoryLimits { gpu_points: 3600 }, 1.0, "lib".into());
        store.set_sessions(Sessions::new(SessionLimits::default()).with_id_epoch(t0));
        Self {
            store,
            t0,
            polls: 0,
        }
    }

    fn poll(&mut self, n: u32) {
        for _ in 0..n {
            let ts = self.t0 + f64::from(self.polls);
            let used = (10 + u64::from(self.polls % 7)) * GIB;
            let gpus = (0..3).map(|i| fixtures::gpu(i, used * u64::from(i + 1)).reading);
            let steady = (0..4).map(|k| fixtures::process(0, 1000 + k, "python", "ann", GIB));
            let growing = (0..3).map(|k| {
                let used = GIB + u64::from(self.polls) * (1 << 20);
                fixtures::process(1, 2000 + k, "torchrun", "bob", used)
            });
            self.store.apply(
                NodeReading {
                    ts,
                    driver_version: None,
                    gpus: gpus.collect(),
                    processes: steady.chain(growing).collect(),
                },
                0.001,
            );
            self.polls += 1;
        }
    }

    /// A trainer; rank 2 runs in GPU 0's process 1002, so that process names its session.
    fn open(&mut self, rank: u64) -> u64 {
        let on_gpu0 = rank == 2;
        let hello = Hello {
            v: 1,
            job: Some("j".into()),
            rank: Some(rank),
            gpu_uuid: on_gpu0.then(|| fixtures::gpu(0, 0).reading.identity.uuid),
            ..Hello::default()
        };
        let peer = Peer {
            pid: if on_gpu0 { 1002 } else { 100 + rank as u32 },
            uid: 0,
            gid: 0,
        };
        self.store.open(peer, hello, self.t0).0
    }

    fn samples(&mut self, key: u64, from: u64, n: u64) {
        for step in from..from + n {
            let a = GIB + step * (1 << 20);
            let sample = Sample {
                ts: self.t0 + step as f64 * 0.01,
                step: Some(step),
                phase: if step % 5 == 0 { "eval" } else { "train" }.into(),
                stats: Stats {
                    allocated: Some(a),
                    allocated_peak: Some(a + GIB),
                    reserved: Some(a + 2 * GIB),
                    ..Stats::default()
                },
                device_free: None,
                device_total: None,
                alloc_limit: None,
                categories: None,
            };
            self.store.sessions.sample(key, sample, self.t0 + 100.0);
        }
    }

    /// The answer to `?history=300` with `since`, as a client reads it off the wire.
    fn answer(&self, since: Option<&str>) -> Snapshot {
        let s = Snapshot::build_since(&self.store, "h", 300.0, since);
        serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap()
    }
}

fn node() -> Node {
    Node::new(Origin::Daemon {
        url: "http://h:9477".into(),
    })
}

/// The cursor as another daemon process would have written it: the same counts, its own
/// instance (one daemon process has one store, so a test's second store shares the instance).
fn from_elsewhere(cursor: &str) -> String {
    format!("zz{}", &cursor[cursor.find('.').unwrap()..])
}

/// What the views draw from: sessions (their windows) and processes (the rest of a delta is
/// whole).
fn held(n: &Node) -> serde_json::Value {
    let s = n.snap.as_ref().unwrap();
    let sessions: Vec<SessionView> = s
        .sessions
        .iter()
        .map(|v| SessionView {
            series: window(v).to_vec(),
            ..v.clone()
        })
        .collect();
    serde_json::json!({"sessions": sessions, "processes": s.processes})
}

#[test]
fn a_whole_answer_then_deltas_leave_the_state_one_whole_answer_gives() {
    let mut d = Daemon::new();
    let (a, b, c) = (d.open(0), d.open(1), d.open(2));
    d.poll(50);
    d.samples(a, 0, 250);
    d.samples(b, 0, 10);
    let first = d.answer(Some(""));
    assert!(!first.delta);
    assert_eq!(
        first.processes[2].session.as_deref(),
        Some(&*first.sessions[2].session)
    );
    let mut incremental = node();
    incremental.absorb(first.clone());

    // More than a window's worth for one trainer, a few for others, one ends, one starts.
    d.poll(10);
    d.samples(a, 250, 400);
    d.samples(b, 10, 3);
    d.samples(c, 0, 5);
    d.store.close(b, Ending::Clean, d.t0 + 120.0);
    let e = d.open(3);
    d.samples(e, 0, 7);
    let delta = d.answer(first.cursor.as_deref());
    assert!(delta.delta);
    let lens: Vec<_> = delta.sessions.iter().map(|s| s.series.len()).collect();
    // Live by key (a, c, e), then the ended b: only what the first answer did not have.
    assert_eq!(lens, vec![300, 5, 7, 3]);
    // GPU 0's processes held their memory: left out; GPU 1's grew: sent.
    assert_eq!(delta.processes_kept, vec![0]);
    assert!(delta.processes.len() == 3 && delta.processes.iter().all(|p| p.gpu == 1));
    let last_gpu = first.gpus[0].history.last().unwrap().ts;
    assert_eq!(delta.gpus[0].history.len(), 10);
    assert!(delta
        .gpus
        .iter()
        .flat_map(|g| &g.history)
        .all(|p| p.ts > last_gpu));
    incremental.absorb(delta.clone());

    // Nothing new: a delta with nothing in it changes nothing.
    let quiet = d.answer(delta.cursor.as_deref());
    assert!(quiet.delta && quiet.gpus.iter().all(|g| g.history.is_empty()));
    assert!(quiet.sessions.iter().all(|s| s.series.is_empty()));
    assert!(quiet.processes.is_empty() && quiet.processes_kept == vec![0, 1]);
    incremental.absorb(quiet.clone());

    // Process 1002's trainer ends: GPU 0's processes change (no session), GPU 1's do not. A few
    // more points for a full window: the node keeps them past the window (slack) for now.
    d.store.close(c, Ending::Crash, d.t0 + 130.0);
    d.samples(a, 650, 10);
    let after_end = d.answer(quiet.cursor.as_deref());
    assert_eq!(after_end.processes_kept, vec![1]);
    assert_eq!(after_end.processes.len(), 4);
    incremental.absorb(after_end);
    let kept = &incremental.snap.as_ref().unwrap().sessions[0];
    assert_eq!((kept.series.len(), window(kept).len()), (310, 300));

    let mut whole = node();
    whole.absorb(d.answer(None));
    assert_eq!(held(&incremental), held(&whole));
    assert_eq!(incremental.history, whole.history);
    assert_eq!(incremental.history.values().next().unwrap().len(), 60);
}

#[test]
fn a_cursor_this_daemon_did_not_write_gets_a_whole_answer() {
    let mut d = Daemon::new();
    let a = d.open(0);
    d.poll(5);
    d.samples(a, 0, 20);
    let first = d.answer(Some(""));
    let again = d.answer(Some(&from_elsewhere(&first.cursor.unwrap())));
    assert!(!again.delta);
    assert_eq!(again.sessions[0].series.len(), 20);
    assert_eq!(again.gpus[0].history.len(), 5);
    // Without `since` the answer keeps its old shape: no cursor, no delta.
    let plain = serde_json::to_value(Snapshot::build(&d.store, "h", 300.0)).unwrap();
    assert!(plain.get("cursor").is_none() && plain.get("delta").is_none());
}

/// The node after a restart: the whole answer replaces the sessions it held.
#[test]
fn a_whole_answer_after_deltas_replaces_what_the_node_held() {
    let mut d = Daemon::new();
    let a = d.open(0);
    d.poll(3);
    d.samples(a, 0, 30);
    let first = d.answer(Some(""));
    let mut n = node();
    n.absorb(first.clone());
    d.samples(a, 30, 2);
    n.absorb(d.answer(first.cursor.as_deref()));
    let mut other = Daemon::new();
    let x = other.open(0);
    other.poll(3);
    other.samples(x, 0, 4);
    let restarted = other.answer(Some(&from_elsewhere(&first.cursor.unwrap())));
    assert!(!restarted.delta);
    n.absorb(restarted);
    let mut whole = node();
    whole.absorb(other.answer(None));
    assert_eq!(held(&n), held(&whole));
}

/// `--connect A --connect B`: each node merges the deltas of its own daemon, whatever order
/// the answers arrive in; the table is the one whole answers give.
#[test]
fn two_nodes_merge_their_own_deltas() {
    use crate::frontends::tui::app::state::{Action, App, Update};
    let data = |node, s: Snapshot| Action::Data {
        node,
        update: Update::Snapshot(Box::new(s)),
    };
    let mut daemons = [Daemon::new(), Daemon::new()];
    let (mut cursors, mut keys) = (Vec::new(), Vec::new());
    let mut app = App::new(vec![node(), node()], false);
    for (i, d) in daemons.iter_mut().enumerate() {
        let a = d.open(i as u64);
        keys.push(a);
        d.poll(3);
        d.samples(a, 0, 10 + i as u64);
        let first = d.answer(Some(""));
        cursors.push(first.cursor.clone());
        app.update(data(i, first));
    }
    for (i, d) in daemons.iter_mut().enumerate().rev() {
        d.poll(2);
        d.samples(keys[i], 10 + i as u64, 4);
        let delta = d.answer(cursors[i].as_deref());
        assert!(delta.delta);
        app.update(data(i, delta));
    }
    let mut whole = App::new(vec![node(), node()], false);
    for (i, d) in daemons.iter().enumerate() {
        whole.update(data(i, d.answer(None)));
    }
    for i in 0..2 {
        assert_eq!(held(&app.nodes[i]), held(&whole.nodes[i]));
        assert_eq!(app.nodes[i].history, whole.nodes[i].history);
    }
    assert_eq!(
        format!("{:?}", app.procs.rows),
        format!("{:?}", whole.procs.rows)
    );
}
