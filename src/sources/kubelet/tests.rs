//! Names looked up in a recorded kubelet /pods response (tests/fixtures/kubelet), for cgroup
//! paths built the way the kubelet names them from that recording's pod UIDs and container ids.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::core::model::{ProcessKind, ProcessReading};
use crate::sources::procinfo::ProcCache;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/kubelet/podlist_init_container_running.json"
);

fn recording() -> Vec<u8> {
    std::fs::read(FIXTURE).unwrap()
}

// From the recording: coredns (Burstable, running container), myapp-pod (BestEffort, its init
// container running), kube-proxy (Burstable).
const COREDNS_UID: &str = "23476f2c-61e0-11e9-bc12-02f121c1eeb4";
const COREDNS_ID: &str = "509057eef9c66fcae1627a278216e29a0504d9b2e85ccc79c09b316dba7554e2";
// coredns's previous container (lastState.terminated): no longer one of its containers.
const COREDNS_DEAD_ID: &str = "b0428bd7c7be12cdf0b9b06e94804a8c922cefe1f949903d759b8b1b5bcdc159";
const MYAPP_UID: &str = "7760601b-65a6-11e9-bc12-02f121c1eeb4";
const MYAPP_INIT_ID: &str = "922a2f3f14d1724d7eeb6cad2b5138bcbd85948c802fead1af2a1e5d79807e4e";
const PROXY_UID: &str = "2358e669-61e0-11e9-bc12-02f121c1eeb4";
const PROXY_ID: &str = "7fe704a201c2603b1df543c3c450c289cbe0c08319b26bbae69b03d6932ec9a2";
// Not in the recording.
const OTHER_UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

/// /proc/PID/cgroup as the kernel writes it for a container the kubelet started: cgroup v2
/// with the systemd driver, or v1 with cgroupfs (several hierarchies, one line each).
fn cgroup_file(qos: &str, uid: &str, id: &str, systemd_v2: bool) -> String {
    if systemd_v2 {
        let u = uid.replace('-', "_");
        let slice = if qos.is_empty() {
            format!("/kubepods.slice/kubepods-pod{u}.slice")
        } else {
            format!("/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice")
        };
        format!("0::{slice}/cri-containerd-{id}.scope\n")
    } else {
        let path = format!("/kubepods/{qos}/pod{uid}/{id}").replace("//", "/");
        format!(
            "12:memory:{path}\n11:cpu,cpuacct:{path}\n4:devices:{path}\n1:name=systemd:{path}\n0::/\n"
        )
    }
}

/// GPU processes whose /proc entries are a real-format tree under a temporary directory.
fn processes(dir: &Path, cgroups: &[(u32, String)]) -> NodeReading {
    let mut cache = ProcCache::with_root(dir.into());
    let mut processes = Vec::new();
    for (pid, cgroup) in cgroups {
        let p = dir.join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("comm"), "python\n").unwrap();
        std::fs::write(p.join("cgroup"), cgroup).unwrap();
        processes.push(ProcessReading {
            gpu: 0,
            uuid: "GPU-0".into(),
            pid: *pid,
            kind: ProcessKind::Compute,
            used_memory_bytes: Some(1 << 30),
            mig_uuid: None,
            gpu_instance_id: None,
            compute_instance_id: None,
            info: cache.get(*pid, || None),
        });
    }
    NodeReading {
        ts: 1.0,
        driver_version: None,
        gpus: Vec::new(),
        processes,
    }
}

fn names(r: &NodeReading, pid: u32) -> (Option<&str>, Option<&str>, Option<&str>) {
    let p = r.processes.iter().find(|p| p.pid == pid).unwrap();
    (
        p.info.namespace.as_deref(),
        p.info.pod.as_deref(),
        p.info.container_name.as_deref(),
    )
}

fn the_node(dir: &Path) -> NodeReading {
    processes(
        dir,
        &[
            (100, cgroup_file("burstable", COREDNS_UID, COREDNS_ID, true)),
            (
                101,
                cgroup_file("besteffort", MYAPP_UID, MYAPP_INIT_ID, false),
            ),
            (102, cgroup_file("burstable", PROXY_UID, PROXY_ID, false)),
            (
                103,
                cgroup_file("burstable", COREDNS_UID, COREDNS_DEAD_ID, true),
            ),
            (104, cgroup_file("", OTHER_UID, COREDNS_ID, true)),
            (105, "0::/system.slice/ssh.service\n".into()),
        ],
    )
}

#[test]
fn names_from_a_recorded_kubelet_response() {
    let index = parse_pods(&recording()).unwrap();
    assert_eq!(index.len(), 5);
    let dir = tempfile::tempdir().unwrap();
    let mut r = the_node(dir.path());
    // Before the lookup every pod is its UID.
    assert_eq!(names(&r, 100), (None, Some(COREDNS_UID), None));
    annotate(&index, &mut r);
    assert_eq!(
        names(&r, 100),
        (
            Some("kube-system"),
            Some("coredns-747dbcf5df-qmtnl"),
            Some("coredns")
        )
    );
    assert_eq!(
        names(&r, 101),
        (Some("default"), Some("myapp-pod"), Some("init-myservice"))
    );
    assert_eq!(
        names(&r, 102),
        (
            Some("kube-system"),
            Some("kube-proxy-fbv92"),
            Some("kube-proxy")
        )
    );
    // A container the pod no longer runs: the pod is named, the container is not.
    assert_eq!(
        names(&r, 103),
        (Some("kube-system"), Some("coredns-747dbcf5df-qmtnl"), None)
    );
    assert_eq!(names(&r, 104), (None, Some(OTHER_UID), None));
    assert_eq!(names(&r, 105), (None, None, None));
    // The container id label keeps its meaning (12 hex digits) either way.
    let p = r.processes.iter().find(|p| p.pid == 101).unwrap();
    assert_eq!(p.info.container.as_deref(), Some(&MYAPP_INIT_ID[..12]));
}

#[test]
fn an_empty_node_and_garbage() {
    let empty = br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":null}"#;
    assert!(parse_pods(empty).unwrap().is_empty());
    assert!(parse_pods(b"<html>").unwrap_err().contains("not a PodList"));
    // A truncated recording is refused, not half-read.
    let rec = recording();
    assert!(parse_pods(&rec[..rec.len() / 2]).is_err());
}

#[test]
fn variables_in_the_url() {
    let env = |n: &str| (n == "NODE_IP").then(|| "10.0.2.15".to_string());
    assert_eq!(
        expand("https://${NODE_IP}:10250", env).unwrap(),
        "https://10.0.2.15:10250"
    );
    assert_eq!(
        expand("https://kubelet:10250", env).unwrap(),
        "https://kubelet:10250"
    );
    assert!(expand("https://${HOST_IP}:10250", env)
        .unwrap_err()
        .contains("HOST_IP"));
    assert!(expand("https://${NODE_IP:10250", env).is_err());
    assert!(expand("https://${}:10250", env).is_err());
}

/// A kubelet stand-in on a real socket that answers /pods with the recording to the right
/// bearer token (401 otherwise), counting requests.
struct Kube {
    url: String,
    requests: Arc<AtomicUsize>,
}

fn kubelet(token: &'static str) -> Kube {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let count = requests.clone();
    let body = recording();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            count.fetch_add(1, Ordering::SeqCst);
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let authorized = head.starts_with("get /pods ")
                && head.contains(&format!("authorization: bearer {token}\r\n"));
            let (status, body): (&str, &[u8]) = if authorized {
                ("200 OK", &body)
            } else {
                ("401 Unauthorized", b"Unauthorized")
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(body);
        }
    });
    Kube { url, requests }
}

fn config(dir: &Path, token: &str, url: &str) -> KubernetesConfig {
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    KubernetesConfig {
        kubelet_url: Some(url.into()),
        token_file,
        ..KubernetesConfig::default()
    }
}

#[test]
fn fetched_with_the_token_and_refused_without() {
    let kube = kubelet("s3cret-token");
    let dir = tempfile::tempdir().unwrap();
    let good = config(dir.path(), "s3cret-token", &kube.url);
    let index = Kubelet::new(&good, &kube.url).unwrap().fetch().unwrap();
    assert_eq!(index[MYAPP_UID].name, "myapp-pod");

    let bad = config(dir.path(), "wrong-token", &kube.url);
    let err = Kubelet::new(&bad, &kube.url).unwrap().fetch().unwrap_err();
    assert!(err.contains("401") && err.contains("nodes/pods"), "{err}");
    assert!(!err.contains("wrong-token"), "the token leaked: {err}");

    let missing = KubernetesConfig {
        token_file: dir.path().join("absent"),
        ..good.clone()
    };
    let err = Kubelet::new(&missing, &kube.url)
        .unwrap()
        .fetch()
        .unwrap_err();
    assert!(err.contains("token_file"), "{err}");

    // Nothing listens on a port just released.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let gone = format!("http://{port}");
    assert!(Kubelet::new(&good, &gone).unwrap().fetch().is_err());
}

/// The GPU source under the wrapper: the same processes at every poll.
struct Node(NodeReading);

impl GpuSource for Node {
    fn collect(&mut self) -> Result<NodeReading, SourceError> {
        Ok(self.0.clone())
    }
}

#[test]
fn the_poll_names_pods_once_the_kubelet_answered_and_asks_at_most_every_30s() {
    let kube = kubelet("t0ken");
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "t0ken", &kube.url);
    let node = the_node(dir.path());
    let mut named = Named::new(Box::new(Node(node)), &cfg);
    // The first poll does not wait for the kubelet: pods are their UIDs.
    let first = named.collect().unwrap();
    assert_eq!(names(&first, 100), (None, Some(COREDNS_UID), None));
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = named.collect().unwrap();
        if r.processes[0].info.namespace.is_some() || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        names(&r, 101),
        (Some("default"), Some("myapp-pod"), Some("init-myservice"))
    );
    // Processes the recording does not name (104, and 103's dead container) keep asking,
    // but the kubelet is not asked again within 30 s.
    for _ in 0..20 {
        named.collect().unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(kube.requests.load(Ordering::SeqCst), 1);
}

#[test]
fn without_a_kubelet_url_pods_are_their_uids() {
    let dir = tempfile::tempdir().unwrap();
    let mut named = Named::new(
        Box::new(Node(the_node(dir.path()))),
        &KubernetesConfig::default(),
    );
    let r = named.collect().unwrap();
    assert_eq!(names(&r, 101), (None, Some(MYAPP_UID), None));
    assert!(named.off.is_none(), "the reason is logged at the first pod");
    let r = named.collect().unwrap();
    assert_eq!(names(&r, 102), (None, Some(PROXY_UID), None));
}

/// Pods that got their GPU without the device plugin: two through DRA (a ResourceClaim, no
/// `nvidia.com/gpu` in their resources), three sharing one GPU by time-slicing (each asks for
/// `nvidia.com/gpu: 1` of a device the plugin advertises several times). Hand-written in the
/// kubelet's /pods format (tests/fixtures/kubelet/README.md).
const DRA_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/kubelet/podlist_dra_timesliced.json"
);

/// (pid, GPU, pod UID, container id, cgroup line) of each pod's process on the node.
pub(crate) fn dra_and_time_sliced() -> Vec<(u32, u32, &'static str, &'static str, String)> {
    let dra0 = (
        "4f0b7c2e-8d1a-4e6b-9c3f-0a1b2c3d4e5f",
        "4d2910e47cbe2846aed7f3cc8761c9514de04af63db6356f1091d39541e7f2be",
    );
    let dra1 = (
        "5a1c8d3f-9e2b-4f7c-8d40-1b2c3d4e5f60",
        "e8f33b93fa2467a87ef672dafb1be5e5c5643e5bf90d5dd740dc40af904b401a",
    );
    let alice = (
        "6b2d9e4a-0f3c-4a8d-9e51-2c3d4e5f6071",
        "bb3c0ca34fcecebae7462ab34ca08faacdfc6da5dbcbfe52a6dadf5a90fe4e4b",
    );
    let bob = (
        "7c3eaf5b-1a4d-4b9e-8f62-3d4e5f607182",
        "fd9e73c0802d7ac9537b69c49bf4b096b4811d31a419a79d77e3236e6d0f6a59",
    );
    let carol = (
        "8d4fb06c-2b5e-4caf-9073-4e5f60718293",
        "3a5c3eb3c235a831e549d071e01f4eb8a2339647f5cfde227e30c6f492e56349",
    );
    // CRI-O with the systemd driver names the scope `crio-<id>.scope`.
    let crio = format!(
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{}.scope\n",
        dra1.0.replace('-', "_"),
        dra1.1
    );
    vec![
        (
            7001,
            1,
            dra0.0,
            dra0.1,
            cgroup_file("besteffort", dra0.0, dra0.1, true),
        ),
        (7002, 2, dra1.0, dra1.1, crio),
        // Guaranteed pods have no QoS slice; one node still on cgroup v1 with cgroupfs.
        (
            7101,
            0,
            alice.0,
            alice.1,
            cgroup_file("", alice.0, alice.1, true),
        ),
        (7102, 0, bob.0, bob.1, cgroup_file("", bob.0, bob.1, false)),
        (
            7103,
            0,
            carol.0,
            carol.1,
            cgroup_file("", carol.0, carol.1, true),
        ),
    ]
}

#[test]
fn pods_without_the_device_plugin_are_named_from_their_cgroups() {
    let index = parse_pods(&std::fs::read(DRA_FIXTURE).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let procs = dra_and_time_sliced();
    let cgroups: Vec<(u32, String)> = procs.iter().map(|p| (p.0, p.4.clone())).collect();
    let mut r = processes(dir.path(), &cgroups);
    for p in &mut r.processes {
        p.gpu = procs.iter().find(|x| x.0 == p.pid).unwrap().1;
    }
    annotate(&index, &mut r);
    let want = [
        (7001, "ml", "train-dra-0", "trainer"),
        (7002, "ml", "train-dra-1", "trainer"),
        (7101, "notebooks", "nb-alice", "notebook"),
        (7102, "notebooks", "nb-bob", "notebook"),
        (7103, "notebooks", "nb-carol", "notebook"),
    ];
    for (pid, ns, pod, container) in want {
        assert_eq!(
            names(&r, pid),
            (Some(ns), Some(pod), Some(container)),
            "pid {pid}"
        );
    }
    // Three pods' processes on one time-sliced GPU: each its own pod, none merged.
    let on_gpu0: Vec<_> = r.processes.iter().filter(|p| p.gpu == 0).collect();
    assert_eq!(on_gpu0.len(), 3);
    let mut pods: Vec<_> = on_gpu0.iter().map(|p| p.info.pod.clone()).collect();
    pods.dedup();
    assert_eq!(pods.len(), 3);
}
