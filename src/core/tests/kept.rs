//! snapshot::kept's per-GPU hashes, on readings made with the TUI's fixtures.

use crate::core::snapshot::kept::{self, Row};
use crate::core::snapshot::ProcessView;
use crate::frontends::tui::fixtures;

fn view(gpu: u32, pid: u32, used: u64) -> ProcessView {
    ProcessView {
        reading: fixtures::process(gpu, pid, "python", "ann", used),
        session: None,
        ns_pid: None,
        orphaned: false,
    }
}

fn hashes(views: &[ProcessView]) -> Option<Vec<(u32, u64)>> {
    let rows: Vec<Row> = views
        .iter()
        .map(|v| Row {
            reading: &v.reading,
            session: v.session.as_deref(),
            ns_pid: v.ns_pid,
            orphaned: v.orphaned,
        })
        .collect();
    kept::hashes(&rows)
}

#[test]
fn a_gpus_hash_moves_with_any_of_its_processes_and_only_its_own() {
    let base = vec![view(0, 1, 5), view(0, 2, 6), view(1, 3, 7)];
    let h = hashes(&base).unwrap();
    assert_eq!(h.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
    let mut used = base.clone();
    used[1].reading.used_memory_bytes = Some(7);
    let mut joined = base.clone();
    joined[0].session = Some("s-1".into());
    let mut gone = base.clone();
    gone.remove(0);
    for other in [used, joined, gone] {
        let o = hashes(&other).unwrap();
        assert_ne!(o[0], h[0]);
        assert_eq!(o[1], h[1]);
    }
    // Out of GPU order: not hashed, so sent whole.
    assert_eq!(hashes(&[view(1, 3, 7), view(0, 1, 5)]), None);
}
