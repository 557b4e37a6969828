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

/// Each column reads back its own text from the row's one string, the first and last included,
/// and the filter matches text on either side of a column's edge.
#[test]
fn cells_read_back_as_formatted() {
    use super::super::Column;
    let mut node = Node::new(Origin::Daemon {
        url: "http://h:9477".into(),
    });
    node.absorb(fixtures::crowded("gpu-node-1", 2, 10, 2));
    let rows = build(&[node]);
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r.cell(Column::Node), "gpu-node-1");
        let gpu = r.key.gpu.map(|g| g.to_string()).unwrap_or("-".into());
        assert_eq!(r.cell(Column::Gpu), gpu);
        assert!(r.cell(Column::Pid).starts_with(&r.key.pid.to_string()));
        let kinds: Vec<&str> = r.badges.iter().map(|b| b.kind).collect();
        assert_eq!(r.cell(Column::Findings), kinds.join(" "));
        assert!(r.matches(&format!("gpu-node-1 {gpu} {}", r.key.pid)));
        assert!(!r.matches("gpu-node-1gpu"));
    }
}
