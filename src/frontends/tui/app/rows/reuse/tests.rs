use super::super::{build, build_reusing};
use crate::frontends::tui::app::state::{Node, Origin};
use crate::frontends::tui::fixtures;

/// Rows kept from the last refresh are the rows a fresh build makes: after a process's
/// memory moves, a leak fires on a plain process, and a process goes.
#[test]
fn reused_rows_are_the_rows_a_fresh_build_makes() {
    let mut node = Node::new(Origin::Daemon {
        url: "http://h:9477".into(),
    });
    node.absorb(fixtures::crowded("gpu-node-1", 4, 30, 3));
    let mut nodes = vec![node];
    let first = build(&nodes);
    let snap = nodes[0].snap.as_mut().unwrap();
    let plain = snap
        .processes
        .iter()
        .position(|p| p.session.is_none())
        .unwrap();
    let (gpu, pid) = (snap.processes[plain].gpu, snap.processes[plain].pid);
    snap.processes[plain + 1].reading.used_memory_bytes = Some(1);
    snap.processes.remove(plain + 2);
    nodes[0]
        .findings
        .push(serde_json::from_value(fixtures::leak_finding("", pid, gpu)).unwrap());
    let again = build_reusing(&nodes, first);
    assert_eq!(format!("{again:?}"), format!("{:?}", build(&nodes)));
    assert!(again.iter().any(|r| r.key.pid == pid && r.firing()));
}
