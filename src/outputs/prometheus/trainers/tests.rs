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
        store.sessions.open(peer, hello, 1.0);
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
        .contains(r#",container="4f1c2a9b8e3d",namespace="default",pod="myapp-pod"} 1"#));
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
            .ends_with(r#"job="j",rank=""} 0"#)
    );
}
