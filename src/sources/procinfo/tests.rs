use super::*;

#[test]
fn a_missing_procfs_is_an_error_and_an_empty_one_a_warning() {
    assert_eq!(check_root(std::path::Path::new("/proc")), Ok(None));
    let dir = tempfile::tempdir().unwrap();
    let warning = check_root(dir.path()).unwrap().unwrap();
    assert!(
        warning.contains(&dir.path().display().to_string()),
        "{warning}"
    );
    let missing = dir.path().join("absent");
    let err = check_root(&missing).unwrap_err();
    assert!(err.contains(&missing.display().to_string()), "{err}");
}

const ID: &str = "3f4e1b2c9d8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e";

#[test]
fn container_ids_from_each_runtime() {
    let cases = [
        format!("/docker/{ID}"),
        format!("/system.slice/docker-{ID}.scope"),
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-{ID}.scope"),
        format!("/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/{ID}"),
        format!("/machine.slice/libpod-{ID}.scope/container"),
        format!("/crio-{ID}"),
    ];
    for c in &cases {
        assert_eq!(container_from_cgroup(c).as_deref(), Some(&ID[..12]), "{c}");
    }
}

#[test]
fn pods_and_slurm_jobs_without_container_id() {
    assert_eq!(
        container_from_cgroup(
            "/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"
        )
        .as_deref(),
        Some("pod0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    );
    assert_eq!(
        container_from_cgroup("/slurm/uid_1000/job_4242/step_0/task_0").as_deref(),
        Some("slurm-job-4242")
    );
    assert_eq!(
        container_from_cgroup("/user.slice/user-1000.slice/session-3.scope"),
        None
    );
}

#[test]
fn pod_uid_and_container_id_for_each_driver_and_runtime() {
    let uid = "2358e669-61e0-11e9-bc12-02f121c1eeb4";
    let u_ = uid.replace('-', "_");
    let want = |id: Option<&str>| {
        Some(KubeIds {
            pod_uid: uid.into(),
            container_id: id.map(str::to_string),
        })
    };
    let cases = [
        // cgroup v2, systemd driver (kubeadm's default), containerd, burstable QoS.
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u_}.slice/cri-containerd-{ID}.scope"),
        // Guaranteed QoS has no QoS level in the path.
        format!("/kubepods.slice/kubepods-pod{u_}.slice/crio-{ID}.scope"),
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u_}.slice/docker-{ID}.scope"),
        // cgroupfs driver (v1 and v2).
        format!("/kubepods/burstable/pod{uid}/{ID}"),
        format!("/kubepods/pod{uid}/{ID}"),
        // Read from inside a cgroup namespace: relative to the reader's own cgroup.
        format!("/../../kubepods-besteffort-pod{u_}.slice/cri-containerd-{ID}.scope"),
    ];
    for c in &cases {
        assert_eq!(kube_ids(c), want(Some(ID)), "{c}");
    }
    // The pod's own slice (the pause container's parent, or a process between exec and
    // its container scope): a pod without a container.
    assert_eq!(
        kube_ids(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u_}.slice"
        )),
        want(None)
    );
    // A static pod's UID is the config hash, without dashes.
    assert_eq!(
        kube_ids(&format!(
            "/kubepods/burstable/pod5795d0c442cb997ff93c49feeb9f6386/{ID}"
        ))
        .map(|k| k.pod_uid)
        .as_deref(),
        Some("5795d0c442cb997ff93c49feeb9f6386")
    );
    for outside in [
        format!("/docker/{ID}"),
        format!("/system.slice/docker-{ID}.scope"),
        "/user.slice/user-1000.slice/session-3.scope".to_string(),
        // Not a kubepods slice, even if named like a pod.
        "/system.slice/podman-pod0f1e2d3c4b5a69788796a5b4c3d2e1f0.slice".to_string(),
    ] {
        assert_eq!(kube_ids(&outside), None, "{outside}");
    }
}

#[test]
fn a_pod_process_is_labelled_with_its_uid_until_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("9");
    fs::create_dir(&p).unwrap();
    fs::write(
        p.join("cgroup"),
        format!("0::/kubepods/besteffort/pod7760601b-65a6-11e9-bc12-02f121c1eeb4/{ID}\n"),
    )
    .unwrap();
    let info = ProcCache::with_root(dir.path().into()).get(9, || None);
    let uid = "7760601b-65a6-11e9-bc12-02f121c1eeb4";
    assert_eq!(info.pod_uid.as_deref(), Some(uid));
    assert_eq!(info.pod.as_deref(), Some(uid));
    assert_eq!(info.namespace, None);
    assert_eq!(info.container.as_deref(), Some(&ID[..12]));
}

#[test]
fn v2_line_wins_and_root_is_no_cgroup() {
    let v1v2 = "12:memory:/docker/abc\n0::/system.slice/ssh.service\n";
    assert_eq!(
        main_cgroup(v1v2).as_deref(),
        Some("/system.slice/ssh.service")
    );
    assert_eq!(main_cgroup("0::/\n"), None);
    let hybrid = "4:memory:/kubepods/pod1/abc\n1:name=systemd:/kubepods/pod1/abc\n0::/\n";
    assert_eq!(main_cgroup(hybrid).as_deref(), Some("/kubepods/pod1/abc"));
}

#[test]
fn reads_a_fake_proc_tree_and_caches_failures() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("77");
    fs::create_dir(&p).unwrap();
    fs::write(p.join("status"), "Name:\tpython\nUid:\t0\t0\t0\t0\n").unwrap();
    fs::write(p.join("cgroup"), format!("0::/docker/{ID}\n")).unwrap();
    let mut cache = ProcCache::with_root(dir.path().into());
    cache.begin();
    let info = cache.get(77, || None);
    assert_eq!(info.name.as_deref(), Some("python"));
    assert_eq!(info.uid, Some(0));
    assert_eq!(info.user.as_deref(), Some("root"));
    assert_eq!(info.container.as_deref(), Some(&ID[..12]));

    let missing = cache.get(78, || Some("from-nvml".into()));
    assert_eq!(missing.name.as_deref(), Some("from-nvml"));
    // Cached: the fallback is not consulted again.
    let again = cache.get(78, || panic!("looked up twice"));
    assert_eq!(again, missing);
    cache.end();
    // The next collection sees only 77: 78 is forgotten, 77 is not looked up again.
    cache.begin();
    assert!(Arc::ptr_eq(&cache.get(77, || None), &info));
    cache.end();
    assert_eq!(cache.len(), 1);
}

/// Read ahead on threads or one by one, a process's info is the same; pids /proc lacks
/// still take NVML's name.
#[test]
fn prefetched_info_is_what_get_reads_alone() {
    let dir = tempfile::tempdir().unwrap();
    for pid in 1000..1100u32 {
        let p = dir.path().join(pid.to_string());
        fs::create_dir(&p).unwrap();
        fs::write(
            p.join("status"),
            format!("Name:\tworker{pid}\nUid:\t{pid}\t0\t0\t0\n"),
        )
        .unwrap();
        fs::write(p.join("cgroup"), format!("0::/docker/{ID}\n")).unwrap();
    }
    let pids = || (990..1100u32).chain([5000]);
    let mut alone = ProcCache::with_root(dir.path().into());
    let mut ahead = ProcCache::with_root(dir.path().into());
    alone.begin();
    ahead.begin();
    ahead.prefetch(pids());
    for pid in pids() {
        let fallback = || Some(format!("nvml{pid}"));
        assert_eq!(
            ahead.get(pid, fallback),
            alone.get(pid, fallback),
            "pid {pid}"
        );
    }
    assert_eq!(ahead.get(1042, || None).uid, Some(1042));
    assert_eq!(ahead.get(5000, || None).name.as_deref(), Some("nvml5000"));
    ahead.end();
    assert!(ahead.read_ahead.is_empty());
    assert_eq!(ahead.len(), 111);
}

/// The kernel writes status's `Name:` as comm with `\` and newline escaped, and nothing else;
/// the name read back is comm's, trailing whitespace dropped.
#[test]
fn the_name_is_comm_unescaped_from_status() {
    let name = |line: &str| status_name(&format!("{line}\nUmask:\t0022\nUid:\t1\t2\t3\t4\n"));
    assert_eq!(name("Name:\tpython").as_deref(), Some("python"));
    // What a program named "w\x<newline>y<tab>z é " shows there.
    assert_eq!(
        name("Name:\tw\\\\x\\ny\tz \u{e9} ").as_deref(),
        Some("w\\x\ny\tz \u{e9}")
    );
    assert_eq!(name("Name:\ta\\\\nb").as_deref(), Some("a\\nb"));
    assert_eq!(
        name("Name:\tkworker/0:1-events").as_deref(),
        Some("kworker/0:1-events")
    );
    assert_eq!(name("Name:\t"), None);
    assert_eq!(name("Name:\t  \\n"), None);
    assert_eq!(status_name("Uid:\t0\t0\t0\t0\n"), None);
}

#[test]
fn the_uid_is_the_first_of_the_uid_line() {
    assert_eq!(
        parse_uid("Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\n"),
        Some(1000)
    );
    // Only a line that starts with the key counts.
    assert_eq!(
        parse_uid("Name:\tUid:\nXUid:\t7\nUid:\t8\t8\t8\t8\r\n"),
        Some(8)
    );
    assert_eq!(parse_uid("Name:\tx\n"), None);
    assert_eq!(parse_uid("Uid:\tx\n"), None);
}

/// One read takes a file that fits the buffer; a larger one is read on to its end, and a
/// file that is not UTF-8 is no text (the process then has no name and no uid).
#[test]
fn files_of_any_size_are_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut reader = Reader::new(dir.path());
    fs::create_dir(dir.path().join("5")).unwrap();
    for len in [0, 1, SCRATCH - 1, SCRATCH, SCRATCH + 1, 3 * SCRATCH + 7] {
        let text: String = (0..len)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        fs::write(dir.path().join("5/cgroup"), &text).unwrap();
        assert_eq!(reader.read(5, "cgroup"), Some(text.as_str()), "{len} bytes");
    }
    assert_eq!(reader.read(5, "absent"), None);
    assert_eq!(reader.read(6, "cgroup"), None);
    fs::write(
        dir.path().join("5/status"),
        b"Name:\t\xff\nUid:\t1\t1\t1\t1\n",
    )
    .unwrap();
    let files = reader.files(5);
    assert_eq!((files.name, files.uid), (None, None));
}

/// The real /proc: this process's own entry reads as comm and status say.
#[test]
fn reads_this_process_from_proc() {
    let pid = std::process::id();
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    let info = ProcCache::new().get(pid, || None);
    assert_eq!(info.name.as_deref(), Some(comm.trim_end()));
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert_eq!(info.uid, parse_uid(&status));
    assert!(info.uid.is_some());
}

/// A process whose name holds what status escapes (a backslash, a newline, a tab) reads with
/// comm's name from the real /proc.
#[test]
fn an_awkward_name_reads_as_comm_says() {
    let Some(sleep) = ["/bin/sleep", "/usr/bin/sleep"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("a\\b\nc\td\u{e9}");
    fs::copy(sleep, &exe).unwrap();
    // Another test's fork can hold the copy open for writing a moment (ETXTBSY): try again.
    let mut tries = 0;
    let mut child = loop {
        match std::process::Command::new(&exe).arg("30").spawn() {
            Err(e) if e.raw_os_error() == Some(26) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => break r.unwrap(),
        }
    };
    let pid = child.id();
    // The child can be seen before exec has renamed it (it has our thread's name till then).
    let want = "a\\b\nc\td\u{e9}\n";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut comm = fs::read_to_string(format!("/proc/{pid}/comm"));
    while comm.as_deref().ok() != Some(want) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
        comm = fs::read_to_string(format!("/proc/{pid}/comm"));
    }
    let info = ProcCache::new().get(pid, || None);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(comm.unwrap(), want);
    assert_eq!(info.name.as_deref(), Some("a\\b\nc\td\u{e9}"));
}

/// The cgroup line picked, and the lines split, as `str::lines` and `split_once` did.
#[test]
fn cgroup_lines_read_as_std_splits_them() {
    fn old_main_cgroup(cgroup: &str) -> Option<String> {
        let mut best: Option<&str> = None;
        for line in cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (id, _ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
            if path == "/" {
                continue;
            }
            if id == "0" {
                best = Some(path);
                break;
            }
            if best.is_none_or(|b| path.matches('/').count() > b.matches('/').count()) {
                best = Some(path);
            }
        }
        best.map(str::to_string)
    }
    let texts = [
        "",
        "\n",
        "\n\n",
        "0::/\n",
        "0::/a/b\n",
        "0::/a/b",
        "0::/a/b\r\n",
        "0::/a/b\r",
        "12:memory:/docker/abc\n0::/system.slice/ssh.service\n",
        "4:memory:/kubepods/pod1/abc\n1:name=systemd:/kubepods/pod1/abc\n0::/\n",
        "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/3f3f\n3:cpuset:/a/b/c\n0::/\n",
        "3:cpu:/a\n2:cpuacct:/b/c\n1:x:/d/e\n",
        "3:cpu:/a\nbroken\n0::/b\n",
        "3:cpu:/a\n\n0::/b\n",
        "1:a:b:c:/x:y\n",
        "1::\n",
        "é:ü:/ø/å\n",
        "1:cpu:/x\r\r\n2:cpu:/y/z\r",
    ];
    for text in texts {
        assert_eq!(main_cgroup(text), old_main_cgroup(text), "{text:?}");
        assert_eq!(
            lines(text).collect::<Vec<_>>(),
            text.lines().collect::<Vec<_>>(),
            "{text:?}"
        );
        for line in text.lines() {
            assert_eq!(split_at(line, b':'), line.split_once(':'), "{line:?}");
        }
    }
}
