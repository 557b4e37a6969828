//! A rank of a job dies and leaves its memory behind: the finding names what the daemon knew of
//! it, from its ended session or, once the store forgot that, from the jobs registry.

use std::sync::Arc;

use super::*;
use crate::core::detect::{DetectConfig, FindingState, Kind};
use crate::core::model::{
    GpuIdentity, GpuReading, GpuState, ProcInfo, ProcState, ProcessKind, ProcessReading,
};
use crate::core::snapshot::Snapshot;
use crate::core::store::sessions::SessionLimits;
use crate::core::store::{HistoryLimits, Store};
use crate::core::trainer::{Ending, Hello, Peer};

const GIB: u64 = 1 << 30;
const UUID: &str = "GPU-3";

fn hello(rank: u64) -> Hello {
    Hello {
        v: 1,
        job: Some("llama-ft".into()),
        run_id: Some("r1".into()),
        rank: Some(rank),
        world_size: Some(8),
        gpu_uuid: Some(UUID.into()),
        ns_pid: Some(40 + rank),
        ..Hello::default()
    }
}

fn peer(pid: u32) -> Peer {
    Peer {
        pid,
        uid: 1000,
        gid: 1000,
    }
}

fn reading(ts: f64, state: ProcState) -> NodeReading {
    NodeReading {
        ts,
        driver_version: None,
        gpus: vec![GpuReading {
            identity: GpuIdentity {
                index: 3,
                uuid: UUID.into(),
                name: "H100".into(),
                pci_bus_id: String::new(),
            },
            state: GpuState::Ok,
            error: None,
            memory: None,
            utilization: None,
            temperature_celsius: None,
            power_watts: None,
            mig_mode: false,
            mig_devices: Vec::new(),
            unified: None,
        }],
        processes: vec![ProcessReading {
            gpu: 3,
            uuid: UUID.into(),
            pid: 81234,
            kind: ProcessKind::Compute,
            used_memory_bytes: Some(19 * GIB + GIB / 2),
            mig_uuid: None,
            gpu_instance_id: None,
            compute_instance_id: None,
            info: Arc::new(ProcInfo {
                name: Some("python".into()),
                state: Some(state),
                ppid: (state == ProcState::Zombie).then_some(80001),
                ..ProcInfo::default()
            }),
        }],
    }
}

fn store(ended_kept: usize) -> Store {
    let mut store = Store::new(HistoryLimits { gpu_points: 8 }, 1.0, String::new());
    store.set_sessions(
        Sessions::new(SessionLimits {
            ended_kept,
            ..SessionLimits::default()
        })
        .with_detect(DetectConfig {
            orphan_grace_seconds: 60.0,
            ..DetectConfig::default()
        }),
    );
    store.nvml.proc_view = Some(ProcView::Host);
    store
}

#[test]
fn a_dead_rank_s_memory_names_its_job_rank_session_and_parent_in_every_reader() {
    let mut store = store(64);
    let (key, id) = store.open(peer(81234), hello(3), 10.0);
    store.close(key, Ending::Crash, 100.0);
    for t in [101.0, 130.0, 161.0] {
        store.apply(reading(t, ProcState::Zombie), 0.001);
    }
    let firing = store.firing_resolved();
    let f = firing
        .iter()
        .find(|f| f.kind == Kind::OrphanedMemory)
        .expect("orphaned_memory fires after the grace");
    assert_eq!(f.gpu, Some(3));
    assert_eq!(
        f.message,
        format!(
            "GPU 3: 19.5 GiB held by pid 81234 (python), which exited 1m ago (zombie of pid \
             80001, job llama-ft rank 3, session {id})"
        )
    );
    assert_eq!(f.subject.ns_pid, Some(43));
    // The API: the finding, and what the daemon can see of the host's pids.
    let snap = Snapshot::build(&store, "node", 0.0);
    assert!(snap
        .findings
        .iter()
        .any(|x| x.kind == Kind::OrphanedMemory && x.state == FindingState::Firing));
    assert_eq!(
        snap.host_pids,
        Some(crate::core::detect::orphan::HostPids::Visible)
    );
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(json["host_pids"], "visible");
    assert_eq!(json["processes"][0]["state"], "zombie");
    assert_eq!(json["processes"][0]["ppid"], 80001);
    assert_eq!(json["processes"][0]["orphaned"], true);
    assert!(store.orphans.orphaned(UUID, 81234));
}

#[test]
fn once_the_store_forgot_the_session_the_jobs_registry_still_knows() {
    // One ended session kept: the next one to end pushes the dead rank's out.
    let mut store = store(1);
    let (dead, id) = store.open(peer(81234), hello(3), 10.0);
    let (other, _) = store.open(peer(555), hello(4), 10.0);
    store.close(dead, Ending::Crash, 100.0);
    store.close(other, Ending::Clean, 101.0);
    assert!(store.sessions.get(&id).is_none(), "forgotten by the store");
    let p = &reading(0.0, ProcState::Gone).processes[0];
    let (live, ended, jobs) = (&store.sessions.live, &store.sessions.ended, &store.jobs);
    let k = known(live.values().chain(ended.iter()), jobs, p);
    assert_eq!(
        k,
        Known {
            session: Some(id),
            job: Some("llama-ft".into()),
            run_id: Some("r1".into()),
            rank: Some(3),
            ns_pid: None,
            ended: Some(100.0),
        }
    );
    // A process gpumon never heard of: nothing known.
    let mut stranger = p.clone();
    stranger.pid = 4;
    assert_eq!(
        known(live.values().chain(ended.iter()), jobs, &stranger),
        Known::default()
    );
}
