use crate::core::model::{NodeReading, ProcInfo, ProcessKind, ProcessReading};
use crate::core::store::{HistoryLimits, Store};
use crate::core::trainer::Hello;
use crate::core::trainer::Peer;
use crate::outputs::prometheus::Exporter;

fn process(pid: u32, pod: Option<(&str, &str)>) -> ProcessReading {
    ProcessReading {
        gpu: 0,
        uuid: "GPU-0".into(),
        pid,
        kind: ProcessKind::Compute,
        used_memory_bytes: Some(7),
        mig_uuid: None,
        gpu_instance_id: None,
        compute_instance_id: None,
        info: ProcInfo {
            name: Some("python".into()),
            namespace: pod.map(|p| p.0.into()),
            pod: pod.map(|p| p.1.into()),
            container: pod.map(|_| "4f1c2a9b8e3d".into()),
            container_name: pod.map(|_| "trainer".into()),
            ..ProcInfo::default()
        }
        .into(),
    }
}

#[test]
fn pods_label_processes_and_sessions_and_are_left_out_outside_kubernetes() {
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    let reading = NodeReading {
        ts: 1.0,
        driver_version: None,
        gpus: vec![],
        processes: vec![
            process(10, Some(("default", "myapp-pod"))),
            process(11, None),
        ],
    };
    store.apply(reading, 0.0);
    for pid in [10, 11] {
        let peer = Peer {
            pid,
            uid: 0,
            gid: 0,
        };
        let hello = Hello {
            v: 1,
            job: Some("j".into()),
            gpu_uuid: Some("GPU-0".into()),
            ..Hello::default()
        };
        store.open(peer, hello, 1.0);
    }
    let text = Exporter::of_store(&store, Default::default())
        .unwrap()
        .render();
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .to_string()
    };
    assert_eq!(
        line(r#"gpumon_process_memory_used_bytes{gpu="0",uuid="GPU-0",pid="10""#),
        r#"gpumon_process_memory_used_bytes{gpu="0",uuid="GPU-0",pid="10",process="python",container="4f1c2a9b8e3d",namespace="default",pod="myapp-pod"} 7"#
    );
    assert!(
        line(r#"gpumon_process_info{gpu="0",uuid="GPU-0",pid="10""#).ends_with(
            r#"mig_uuid="",namespace="default",pod="myapp-pod",container_name="trainer"} 1"#
        )
    );
    assert!(line(r#"gpumon_trainer_info{gpu="",uuid="GPU-0",pid="10""#)
        .contains(r#",container="4f1c2a9b8e3d",namespace="default",pod="myapp-pod",uid=""#));
    assert!(
        line(r#"gpumon_leak_suspected{gpu="",uuid="GPU-0",pid="10""#).ends_with(
            r#"rank="",container="4f1c2a9b8e3d",namespace="default",pod="myapp-pod"} 0"#
        )
    );
    // Outside a pod the series are what they were before pods were labelled.
    assert!(
        line(r#"gpumon_process_memory_used_bytes{gpu="0",uuid="GPU-0",pid="11""#)
            .ends_with(r#"container=""} 7"#)
    );
    assert!(
        line(r#"gpumon_leak_suspected{gpu="",uuid="GPU-0",pid="11""#)
            .ends_with(r#"job_name="j",rank=""} 0"#)
    );
}

/// The session ↔ process join is made once, in the core: a trainer whose device NVML lists no
/// entry for its pid (here GPU-1, while the pid is listed on GPU-0) gets its process's facts
/// from the pid's other entry in the API's session view and in its metric labels alike, and no
/// memory figure (that one is for GPU-0); a trainer on the listed device gets both.
#[test]
fn the_api_and_the_labels_read_one_join() {
    let mut store = Store::new(HistoryLimits { gpu_points: 4 }, 1.0, "lib".into());
    let reading = NodeReading {
        ts: 1.0,
        driver_version: None,
        gpus: vec![],
        processes: vec![process(10, Some(("default", "myapp-pod")))],
    };
    store.apply(reading, 0.0);
    let mut ids = Vec::new();
    for uuid in ["GPU-0", "GPU-1"] {
        let peer = Peer {
            pid: 10,
            uid: 0,
            gid: 0,
        };
        let hello = Hello {
            v: 1,
            job: Some(uuid.into()),
            gpu_uuid: Some(uuid.into()),
            ..Hello::default()
        };
        let (key, _) = store.open(peer, hello, 1.0);
        ids.push(store.sessions.live_session(key).unwrap().id.clone());
    }
    let text = Exporter::of_store(&store, Default::default())
        .unwrap()
        .render();
    for (id, used) in ids.iter().zip([Some(7), None]) {
        let view = crate::core::snapshot::SessionView::lookup(&store, id).unwrap();
        let nvml = view.nvml.expect("the pid's facts");
        assert_eq!(
            (nvml.pod.as_deref(), nvml.used_memory_bytes),
            (Some("myapp-pod"), used),
            "{id}"
        );
        let job = view.job.unwrap();
        let info = text
            .lines()
            .find(|l| {
                l.starts_with("gpumon_trainer_info{") && l.contains(&format!("job_name=\"{job}\""))
            })
            .unwrap_or_else(|| panic!("no trainer_info for {job} in\n{text}"));
        assert!(info.contains(r#"pod="myapp-pod""#), "{info}");
    }
}
