use super::*;
use crate::core::model::LimitFrom;

const GIB: u64 = 1 << 30;

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A procfs whose meminfo says `gib` GiB available, and a cgroup root, both empty otherwise.
fn node(gib: u64) -> (tempfile::TempDir, tempfile::TempDir) {
    let proc_ = tempfile::tempdir().unwrap();
    let cg = tempfile::tempdir().unwrap();
    let kib = gib * GIB / 1024;
    write(
        proc_.path(),
        "meminfo",
        &format!("MemAvailable: {kib} kB\n"),
    );
    (proc_, cg)
}

fn host(proc_: &tempfile::TempDir, cg: &tempfile::TempDir) -> HostMemory {
    HostMemory {
        procfs: proc_.path().into(),
        cgroupfs: cg.path().into(),
    }
}

#[test]
fn mem_available_is_read_in_bytes() {
    let m =
        "MemTotal:       128000000 kB\nMemFree:         1000 kB\nMemAvailable:   100000000 kB\n";
    assert_eq!(mem_available(m), Some(100_000_000 * 1024));
    assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    assert_eq!(mem_available("MemAvailable: lots kB\n"), None);
}

#[test]
fn the_v2_line_names_the_cgroup() {
    assert_eq!(
        v2_path("4:memory:/a\n0::/kubepods.slice/x.scope\n"),
        Some("/kubepods.slice/x.scope")
    );
    assert_eq!(v2_path("4:memory:/a\n"), None);
}

/// Two processes in two containers under one pod slice: the tightest room left counts, and a
/// level that sets no limit ("max") or whose usage cannot be read counts for nothing.
#[test]
fn the_tightest_cgroup_bounds_the_device() {
    let (proc_, cg) = node(100);
    write(proc_.path(), "10/cgroup", "0::/pod.slice/a.scope\n");
    write(proc_.path(), "11/cgroup", "0::/pod.slice/b.scope\n");
    write(cg.path(), "memory.max", "max\n");
    write(
        cg.path(),
        "pod.slice/memory.max",
        &format!("{}\n", 64 * GIB),
    );
    write(
        cg.path(),
        "pod.slice/memory.current",
        &format!("{}\n", 24 * GIB),
    );
    write(
        cg.path(),
        "pod.slice/a.scope/memory.max",
        &format!("{}\n", 16 * GIB),
    );
    write(
        cg.path(),
        "pod.slice/a.scope/memory.current",
        &format!("{}\n", 10 * GIB),
    );
    // b's own limit has no usage beside it: skipped, its parent's still binds.
    write(
        cg.path(),
        "pod.slice/b.scope/memory.max",
        &format!("{}\n", GIB),
    );
    let host = host(&proc_, &cg);
    let u = host.read(&[10, 11], Some(12 * GIB));
    assert_eq!(u.host_available, Some(100 * GIB));
    assert_eq!(u.cgroup_headroom, Some(6 * GIB));
    assert_eq!(u.limit_from, Some(LimitFrom::CgroupMax));
    let m = u.memory().unwrap();
    assert_eq!((m.used, m.free, m.total), (12 * GIB, 6 * GIB, 18 * GIB));

    // Only b: the pod slice's 40 GiB left, below the host's 100.
    let u = host.read(&[11], Some(GIB));
    assert_eq!(u.cgroup_headroom, Some(40 * GIB));
    assert_eq!(u.memory().unwrap().total, 41 * GIB);
}

#[test]
fn the_host_bounds_when_no_cgroup_limits_less() {
    let (proc_, cg) = node(30);
    write(proc_.path(), "10/cgroup", "0::/user.slice\n");
    write(
        cg.path(),
        "user.slice/memory.max",
        &format!("{}\n", 200 * GIB),
    );
    write(cg.path(), "user.slice/memory.current", "0\n");
    let host = host(&proc_, &cg);
    let u = host.read(&[10], Some(2 * GIB));
    assert_eq!(u.limit_from, Some(LimitFrom::HostAvailable));
    assert_eq!(u.memory().unwrap().total, 32 * GIB);
}

/// A figure missing is "n/a": no memory at all, never a guess.
#[test]
fn a_missing_figure_leaves_the_memory_unknown() {
    let proc_ = tempfile::tempdir().unwrap();
    let host = HostMemory {
        procfs: proc_.path().into(),
        cgroupfs: proc_.path().join("none"),
    };
    let u = host.read(&[10], Some(GIB));
    assert_eq!((u.host_available, u.limit_from), (None, None));
    assert_eq!(u.memory(), None);
    write(proc_.path(), "meminfo", "MemAvailable: 1024 kB\n");
    let u = host.read(&[10], None);
    assert_eq!(u.memory(), None);
    assert_eq!(u.limit_from, Some(LimitFrom::HostAvailable));
}

#[test]
fn the_v1_memory_line_names_the_cgroup() {
    let text = "12:pids:/x\n9:cpuacct,cpu:/x\n4:memory:/slurm/uid_1000/job_7/step_0\n0::/x\n";
    assert_eq!(v1_memory_path(text), Some("/slurm/uid_1000/job_7/step_0"));
    assert_eq!(v1_memory_path("4:memory,hugetlb:/a:b\n"), Some("/a:b"));
    assert_eq!(v1_memory_path("9:cpuacct,cpu:/x\n0::/x\n"), None);
    // A controller whose name merely contains "memory" is not it.
    assert_eq!(v1_memory_path("5:nomemory:/x\n"), None);
}

/// A hybrid host (v2 mounted without controllers, v1's memory controller beside it), as older
/// Jetson and HPC images run: the Slurm step's v1 limit binds; its job's "unlimited" and a v2
/// path with no memory files count for nothing.
#[test]
fn a_v1_memory_limit_bounds_the_device_on_a_hybrid_host() {
    let (proc_, cg) = node(50);
    write(
        proc_.path(),
        "10/cgroup",
        "4:memory:/slurm/job_7/step_0\n0::/system.slice/slurmd.service\n",
    );
    write(
        cg.path(),
        "system.slice/slurmd.service/cgroup.procs",
        "10\n",
    );
    write(
        cg.path(),
        "memory/slurm/job_7/memory.limit_in_bytes",
        "9223372036854771712\n",
    );
    write(
        cg.path(),
        "memory/slurm/job_7/memory.usage_in_bytes",
        &format!("{}\n", 9 * GIB),
    );
    write(
        cg.path(),
        "memory/slurm/job_7/step_0/memory.limit_in_bytes",
        &format!("{}\n", 20 * GIB),
    );
    write(
        cg.path(),
        "memory/slurm/job_7/step_0/memory.usage_in_bytes",
        &format!("{}\n", 8 * GIB),
    );
    let host = host(&proc_, &cg);
    let u = host.read(&[10], Some(4 * GIB));
    assert_eq!(u.cgroup_headroom, Some(12 * GIB));
    assert_eq!(u.limit_from, Some(LimitFrom::CgroupMax));
    assert_eq!(u.memory().unwrap().total, 16 * GIB);

    // The step's limit raised past what the host has left: the host binds.
    write(
        cg.path(),
        "memory/slurm/job_7/step_0/memory.limit_in_bytes",
        &format!("{}\n", 100 * GIB),
    );
    let u = host.read(&[10], Some(4 * GIB));
    assert_eq!(u.cgroup_headroom, Some(92 * GIB));
    assert_eq!(u.limit_from, Some(LimitFrom::HostAvailable));
}

/// A v2 limit wins over a v1 one: on a pure v2 host the memory controller line is absent, and
/// where both could be read the v2 hierarchy is the one the kernel enforces for the process.
#[test]
fn a_v2_limit_is_read_before_v1() {
    let (proc_, cg) = node(50);
    write(proc_.path(), "10/cgroup", "4:memory:/a\n0::/b\n");
    write(cg.path(), "b/memory.max", &format!("{}\n", 10 * GIB));
    write(cg.path(), "b/memory.current", &format!("{}\n", GIB));
    write(
        cg.path(),
        "memory/a/memory.limit_in_bytes",
        &format!("{}\n", 2 * GIB),
    );
    write(
        cg.path(),
        "memory/a/memory.usage_in_bytes",
        &format!("{}\n", GIB),
    );
    let host = host(&proc_, &cg);
    assert_eq!(host.read(&[10], Some(GIB)).cgroup_headroom, Some(9 * GIB));
}

/// The daemon in a container with its own cgroup namespace (the DaemonSet, docker): a trainer
/// in another pod reads as `/../../<its pod>/<its container>` and cannot be found in this view,
/// whose root holds the daemon container's own limit. Neither binds the device: the host does.
/// With no process at all, no cgroup binds either.
#[test]
fn a_cgroup_outside_the_daemons_namespace_is_not_guessed() {
    let (proc_, cg) = node(50);
    write(
        proc_.path(),
        "10/cgroup",
        "0::/../../kubepods-pod1.slice/cri-containerd-2.scope\n",
    );
    // The daemon container's own 128 MiB limit, at the root of its view.
    write(cg.path(), "memory.max", "134217728\n");
    write(cg.path(), "memory.current", "33554432\n");
    write(
        cg.path(),
        "kubepods-pod1.slice/cri-containerd-2.scope/memory.max",
        &format!("{}\n", 2 * GIB),
    );
    write(
        cg.path(),
        "kubepods-pod1.slice/cri-containerd-2.scope/memory.current",
        "0\n",
    );
    let host = host(&proc_, &cg);
    let u = host.read(&[10], Some(GIB));
    assert_eq!(u.cgroup_headroom, None);
    assert_eq!(u.limit_from, Some(LimitFrom::HostAvailable));
    assert_eq!(u.memory().unwrap().total, 51 * GIB);
    assert_eq!(host.read(&[], Some(0)).cgroup_headroom, None);
}
