use super::*;
use crate::core::model::LimitFrom;

const GIB: u64 = 1 << 30;

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
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
    let proc_ = tempfile::tempdir().unwrap();
    let cg = tempfile::tempdir().unwrap();
    write(
        proc_.path(),
        "meminfo",
        &format!("MemAvailable: {} kB\n", 100 * GIB / 1024),
    );
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
    let host = HostMemory {
        procfs: proc_.path().into(),
        cgroupfs: cg.path().into(),
    };
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
    let proc_ = tempfile::tempdir().unwrap();
    let cg = tempfile::tempdir().unwrap();
    write(
        proc_.path(),
        "meminfo",
        &format!("MemAvailable: {} kB\n", 30 * GIB / 1024),
    );
    write(proc_.path(), "10/cgroup", "0::/user.slice\n");
    write(
        cg.path(),
        "user.slice/memory.max",
        &format!("{}\n", 200 * GIB),
    );
    write(cg.path(), "user.slice/memory.current", "0\n");
    let host = HostMemory {
        procfs: proc_.path().into(),
        cgroupfs: cg.path().into(),
    };
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
