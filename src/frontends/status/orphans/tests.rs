use serde_json::json;

use super::super::{table, Origin};
use crate::core::detect::orphan::HostPids;
use crate::core::snapshot::Snapshot;
use crate::core::store::{HistoryLimits, Store};

fn node() -> Snapshot {
    let empty = Store::new(HistoryLimits { gpu_points: 1 }, 1.0, String::new());
    Snapshot::build(&empty, "node-a", 0.0)
}

fn origin() -> Origin {
    Origin::Daemon("http://127.0.0.1:9400/api/v1/snapshot".into())
}

#[test]
fn orphaned_memory_is_listed_with_what_to_do() {
    let mut snap = node();
    snap.host_pids = Some(HostPids::Visible);
    snap.findings.push(
        serde_json::from_value(json!({
            "id": "orphaned-1", "kind": "orphaned_memory", "state": "firing",
            "severity": "warning", "session": "s-5", "job": "llama-ft", "rank": 3,
            "pid": 81234, "gpu_uuid": "GPU-3", "gpu": "3", "first_ts": 1.0, "updated_ts": 2.0,
            "message": "GPU 3: 19.5 GiB held by pid 81234 (python), which exited 12m ago \
                        (zombie of pid 80001 (torchrun), job llama-ft rank 3, session s-5)",
            "hint": "pid 80001 (torchrun) has not reaped its exited child 81234: \u{1b}[2J",
            "evidence": {}
        }))
        .unwrap(),
    );
    let out = table(&snap, &origin());
    let at = out.find("ORPHANED MEMORY").expect(&out);
    let section = &out[at..];
    assert!(
        section.contains("\n  GPU 3: 19.5 GiB held by pid 81234 (python), which exited 12m ago"),
        "{out}"
    );
    assert!(
        section.contains("\n    what to do: pid 80001 (torchrun) has not reaped"),
        "{out}"
    );
    // Escaped like every string from the node.
    assert!(!out.contains('\u{1b}'), "{out}");
    assert!(!out.contains("not judged"), "{out}");
}

#[test]
fn a_daemon_without_the_host_s_pids_says_it_cannot_judge() {
    let mut snap = node();
    assert!(!table(&snap, &origin()).contains("orphaned memory"));
    snap.host_pids = Some(HostPids::Hidden);
    let out = table(&snap, &origin());
    assert!(
        out.contains("\norphaned memory not judged: none of the processes NVML lists is in /proc"),
        "{out}"
    );
    assert!(!out.contains("ORPHANED MEMORY"), "{out}");
}
