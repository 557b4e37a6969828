use std::sync::Arc;

use super::*;
use crate::core::model::{GpuIdentity, GpuReading, ProcInfo, ProcessKind};

const GIB: u64 = 1 << 30;
const GPU3: &str = "GPU-3";

fn gpu(index: u32, uuid: &str, state: GpuState) -> GpuReading {
    GpuReading {
        identity: GpuIdentity {
            index,
            uuid: uuid.into(),
            name: "H100".into(),
            pci_bus_id: String::new(),
        },
        state,
        error: None,
        memory: None,
        utilization: None,
        temperature_celsius: None,
        power_watts: None,
        mig_mode: false,
        mig_devices: Vec::new(),
        unified: None,
    }
}

/// A process on GPU 3 as /proc last saw it: `state` (None: never looked at), a zombie's parent.
fn row(pid: u32, used: u64, state: Option<ProcState>, ppid: Option<u32>) -> ProcessReading {
    ProcessReading {
        gpu: 3,
        uuid: GPU3.into(),
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: Some(used),
        mig_uuid: None,
        gpu_instance_id: None,
        compute_instance_id: None,
        info: Arc::new(ProcInfo {
            name: Some("python".into()),
            container: Some("3f4e1b2c9d8a".into()),
            state,
            ppid,
            parent: ppid.map(|_| "torchrun".into()),
            ..ProcInfo::default()
        }),
    }
}

fn reading(ts: f64, gpu3: GpuState, processes: Vec<ProcessReading>) -> NodeReading {
    NodeReading {
        ts,
        driver_version: None,
        gpus: vec![gpu(3, GPU3, gpu3)],
        processes,
    }
}

fn nobody(_: &ProcessReading) -> Known {
    Known::default()
}

const ZOMBIE: Option<ProcState> = Some(ProcState::Zombie);
const GONE: Option<ProcState> = Some(ProcState::Gone);
const RUNS: Option<ProcState> = Some(ProcState::Running);

#[test]
fn what_proc_shows_is_told_from_its_view_and_the_rows() {
    let host = Some(ProcView::Host);
    let own = Some(ProcView::Own);
    let unknown = Some(ProcView::Unknown);
    // The host's /proc: a missing pid has exited, whatever the rows say.
    assert_eq!(
        host_pids(host, [GONE, GONE].into_iter()),
        Some(HostPids::Visible)
    );
    assert_eq!(host_pids(host, std::iter::empty()), Some(HostPids::Visible));
    // A container's own /proc with none of NVML's pids in it: hidden (no hostPID).
    assert_eq!(
        host_pids(own, [GONE, GONE].into_iter()),
        Some(HostPids::Hidden)
    );
    assert_eq!(host_pids(None, [GONE].into_iter()), Some(HostPids::Hidden));
    // Some are there: only zombies can be judged.
    assert_eq!(
        host_pids(own, [GONE, RUNS].into_iter()),
        Some(HostPids::Partial)
    );
    assert_eq!(
        host_pids(unknown, [ZOMBIE, GONE].into_iter()),
        Some(HostPids::Partial)
    );
    // Nothing listed (or nothing looked at): nothing to tell yet.
    assert_eq!(host_pids(own, std::iter::empty()), None);
    assert_eq!(host_pids(own, [None, None].into_iter()), None);

    let judged = |seen, state| exited(Some(seen), state);
    assert!(judged(HostPids::Visible, ZOMBIE) && judged(HostPids::Visible, GONE));
    assert!(!judged(HostPids::Visible, RUNS) && !judged(HostPids::Visible, None));
    assert!(judged(HostPids::Partial, ZOMBIE) && !judged(HostPids::Partial, GONE));
    assert!(!judged(HostPids::Hidden, ZOMBIE) && !judged(HostPids::Hidden, GONE));
    assert!(!exited(None, ZOMBIE));
}

#[test]
fn a_zombie_fires_after_the_grace_names_its_parent_and_resolves_when_freed() {
    let mut o = Orphans::default();
    let mut out = Findings::default();
    let host = Some(ProcView::Host);
    let zombie = || row(81234, 19 * GIB + GIB / 2, ZOMBIE, Some(80001));
    let live = || row(4242, 10 * GIB, RUNS, None);
    for t in [100.0, 130.0, 159.0] {
        o.poll(
            &reading(t, GpuState::Ok, vec![zombie(), live()]),
            host,
            60.0,
            &nobody,
            &mut out,
        );
        assert_eq!(o.current().count(), 0, "within the grace at {t}");
    }
    o.poll(
        &reading(160.0, GpuState::Ok, vec![zombie(), live()]),
        host,
        60.0,
        &nobody,
        &mut out,
    );
    let f = o.current().next().unwrap().clone();
    assert_eq!(f.kind, Kind::OrphanedMemory);
    assert_eq!(f.state, FindingState::Firing);
    assert_eq!((f.subject.pid, f.gpu), (81234, Some(3)));
    assert_eq!(f.subject.gpu_uuid.as_deref(), Some(GPU3));
    assert_eq!(f.first_ts, 100.0);
    assert_eq!(
        f.message,
        "GPU 3: 19.5 GiB held by pid 81234 (python), which exited at least 1m ago \
         (zombie of pid 80001 (torchrun), container 3f4e1b2c9d8a)"
    );
    let hint = f.hint.as_deref().unwrap();
    assert!(hint.contains("kill 80001"), "{hint}");
    assert!(hint.contains("nvidia-smi --gpu-reset -i 3"), "{hint}");
    let e = f.evidence.orphan.as_deref().unwrap();
    assert_eq!(
        (e.bytes, e.state, e.parent_pid),
        (Some(19 * GIB + GIB / 2), ProcState::Zombie, Some(80001))
    );
    assert!(o.orphaned(GPU3, 81234) && !o.orphaned(GPU3, 4242));
    // Fired once, to the sinks and the counters.
    let posted = out.drain();
    assert_eq!(posted.len(), 1);
    assert_eq!(
        out.totals().find(|(k, _)| *k == Kind::OrphanedMemory),
        Some((Kind::OrphanedMemory, 1))
    );

    // Still held a while later: the same finding, its words moved on, nothing posted.
    o.poll(
        &reading(400.0, GpuState::Ok, vec![zombie(), live()]),
        host,
        60.0,
        &nobody,
        &mut out,
    );
    let later = o.current().next().unwrap();
    assert_eq!(later.id, f.id);
    assert!(
        later.message.contains("at least 5m ago"),
        "{}",
        later.message
    );
    assert!(out.drain().is_empty());

    // NVML no longer lists it: resolved, with why.
    o.poll(
        &reading(401.0, GpuState::Ok, vec![live()]),
        host,
        60.0,
        &nobody,
        &mut out,
    );
    assert_eq!(o.current().count(), 0);
    let resolved = out.drain();
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0].state, FindingState::Resolved);
    assert_eq!(resolved[0].resolved_ts, Some(401.0));
    assert!(
        resolved[0]
            .message
            .ends_with("NVML no longer lists its memory"),
        "{}",
        resolved[0].message
    );
    assert_eq!(out.recent().count(), 1);
}

#[test]
fn a_live_process_is_never_flagged_and_a_short_teardown_is_not_either() {
    let mut o = Orphans::default();
    let mut out = Findings::default();
    let host = Some(ProcView::Host);
    for t in 0..600 {
        // A process running for ten minutes; another listed for 30 s after it exited (the
        // driver tearing its context down), then gone from NVML.
        let mut rows = vec![row(4242, 10 * GIB, RUNS, None), row(7, GIB, None, None)];
        if (100..130).contains(&t) {
            rows.push(row(5555, 2 * GIB, GONE, None));
        }
        o.poll(
            &reading(t as f64, GpuState::Ok, rows),
            host,
            60.0,
            &nobody,
            &mut out,
        );
    }
    assert_eq!(o.current().count(), 0);
    assert!(out.drain().is_empty());
    assert_eq!(out.totals().map(|(_, n)| n).sum::<u64>(), 0);
}

#[test]
fn a_gone_process_names_what_gpumon_knew_and_says_to_reset_the_gpu() {
    let mut o = Orphans::default();
    let mut out = Findings::default();
    let known = |_: &ProcessReading| Known {
        session: Some("s-abc-5".into()),
        job: Some("llama-ft".into()),
        run_id: Some("r1".into()),
        rank: Some(3),
        ns_pid: Some(17),
        ended: Some(30.0),
    };
    for t in [100.0, 200.0] {
        o.poll(
            &reading(t, GpuState::Ok, vec![row(81234, 4 * GIB, GONE, None)]),
            Some(ProcView::Host),
            60.0,
            &known,
            &mut out,
        );
    }
    let f = o.current().next().unwrap();
    assert_eq!(
        f.message,
        "GPU 3: 4.0 GiB held by pid 81234 (python), which exited 2m ago (no such process left, \
         job llama-ft rank 3, session s-abc-5, container 3f4e1b2c9d8a)"
    );
    assert_eq!(
        (f.subject.session.as_str(), f.subject.rank, f.subject.ns_pid),
        ("s-abc-5", Some(3), Some(17))
    );
    assert_eq!(f.subject.run_id.as_deref(), Some("r1"));
    let hint = f.hint.as_deref().unwrap();
    assert!(
        hint.contains("fuser -v /dev/nvidia*") && hint.contains("nvidia-smi --gpu-reset -i 3"),
        "{hint}"
    );
    assert!(!hint.contains("kill"), "{hint}");
}

#[test]
fn without_the_hosts_pids_nothing_is_raised_and_what_fired_resolves() {
    let mut o = Orphans::default();
    let mut out = Findings::default();
    // A container's own /proc: none of NVML's (host) pids is in it.
    let own = Some(ProcView::Own);
    for t in 0..300 {
        let rows = vec![row(81234, 4 * GIB, GONE, None), row(4242, GIB, GONE, None)];
        o.poll(
            &reading(t as f64, GpuState::Ok, rows),
            own,
            60.0,
            &nobody,
            &mut out,
        );
        assert_eq!(o.host_pids(), Some(HostPids::Hidden));
    }
    assert_eq!(o.current().count(), 0);
    assert!(out.drain().is_empty());

    // Some pids are seen (the driver gives this namespace's pids): zombies only.
    let mut o = Orphans::default();
    for t in 0..100 {
        let rows = vec![
            row(81234, 4 * GIB, GONE, None),
            row(12, GIB, ZOMBIE, Some(1)),
            row(13, GIB, RUNS, None),
        ];
        o.poll(
            &reading(t as f64, GpuState::Ok, rows),
            own,
            60.0,
            &nobody,
            &mut out,
        );
    }
    assert_eq!(o.host_pids(), Some(HostPids::Partial));
    let pids: Vec<u32> = o.current().map(|f| f.subject.pid).collect();
    assert_eq!(pids, vec![12]);
    // Then none is seen any more: judged no longer, and what fired resolves saying why.
    out.drain();
    o.poll(
        &reading(100.0, GpuState::Ok, vec![row(12, GIB, GONE, None)]),
        own,
        60.0,
        &nobody,
        &mut out,
    );
    assert_eq!(o.host_pids(), Some(HostPids::Hidden));
    assert_eq!(o.current().count(), 0);
    let resolved = out.drain();
    assert!(resolved[0]
        .message
        .ends_with("gpumon can no longer see the host's processes"));
}

#[test]
fn a_gpu_that_could_not_be_read_keeps_its_finding() {
    let mut o = Orphans::default();
    let mut out = Findings::default();
    let host = Some(ProcView::Host);
    let zombie = || row(81234, 4 * GIB, ZOMBIE, Some(1));
    o.poll(
        &reading(0.0, GpuState::Ok, vec![zombie()]),
        host,
        10.0,
        &nobody,
        &mut out,
    );
    o.poll(
        &reading(10.0, GpuState::Ok, vec![zombie()]),
        host,
        10.0,
        &nobody,
        &mut out,
    );
    assert_eq!(o.current().count(), 1);
    // Its process list failed this poll: not "no longer listed".
    o.poll(
        &reading(11.0, GpuState::Error, vec![]),
        host,
        10.0,
        &nobody,
        &mut out,
    );
    assert_eq!(o.current().count(), 1);
    o.poll(
        &reading(12.0, GpuState::Ok, vec![zombie()]),
        host,
        10.0,
        &nobody,
        &mut out,
    );
    let f = o.current().next().unwrap();
    assert_eq!((f.first_ts, f.id.as_str()), (0.0, "orphaned-1"));
    // Memory "not available" still fires, in words without a size.
    let mut na = zombie();
    na.pid = 9;
    na.used_memory_bytes = None;
    o.poll(
        &reading(13.0, GpuState::Ok, vec![zombie(), na.clone()]),
        host,
        10.0,
        &nobody,
        &mut out,
    );
    o.poll(
        &reading(30.0, GpuState::Ok, vec![zombie(), na]),
        host,
        10.0,
        &nobody,
        &mut out,
    );
    let f = o.current().find(|f| f.subject.pid == 9).unwrap();
    assert!(
        f.message
            .starts_with("GPU 3: memory held by pid 9 (python)"),
        "{}",
        f.message
    );
}

#[test]
fn on_a_fake_library_s_scenario_pids_only_zombies_are_judged() {
    use crate::core::model::{ProcState, ProcView};
    // Whatever /proc says of the listed pids: the scenario's pids ran on no host.
    let seen = host_pids(
        Some(ProcView::Simulated),
        [Some(ProcState::Gone), Some(ProcState::Gone)].into_iter(),
    );
    assert_eq!(seen, Some(HostPids::Simulated));
    assert!(!exited(seen, Some(ProcState::Gone)));
    assert!(!exited(seen, Some(ProcState::Running)));
    // A zombie is in this host's /proc: a real process that exited.
    assert!(exited(seen, Some(ProcState::Zombie)));
    // The host's /proc on a real NVML: a pid never seen alive is judged exited all the same.
    assert!(exited(Some(HostPids::Visible), Some(ProcState::Gone)));
}
