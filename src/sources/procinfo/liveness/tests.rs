use std::fs;
use std::os::unix::fs::symlink;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::super::ProcCache;
use super::*;

#[test]
fn stat_is_read_past_a_name_with_spaces_and_parentheses() {
    let mut tail: Vec<String> = (5..=52).map(|f| f.to_string()).collect();
    tail[22 - 5] = "987654".into();
    let line = format!("81234 (py (th) on) Z 80001 {}\n", tail.join(" "));
    assert_eq!(
        parse_stat(&line),
        Some(Stat {
            state: ProcState::Zombie,
            ppid: 80001,
            start: 987654
        })
    );
    let dead = line.replace(") Z ", ") X ");
    assert_eq!(parse_stat(&dead).map(|s| s.state), Some(ProcState::Gone));
    let sleeping = line.replace(") Z ", ") S ");
    assert_eq!(
        parse_stat(&sleeping).map(|s| s.state),
        Some(ProcState::Running)
    );
    for bad in [
        "",
        "81234 (x",
        "81234 (x) Z",
        "81234 (x) Z notapid 1 2",
        "\u{0}",
    ] {
        assert_eq!(parse_stat(bad), None, "{bad:?}");
    }
    // This process, as the kernel writes it.
    let me = parse_stat(&fs::read_to_string("/proc/self/stat").unwrap()).unwrap();
    assert_eq!(me.state, ProcState::Running);
    assert_eq!(me.ppid, std::os::unix::process::parent_id());
}

#[test]
fn status_gives_the_state_and_the_parent() {
    let zombie = "Name:\tpython\nState:\tZ (zombie)\nTgid:\t9\nPPid:\t80001\nUid:\t0\t0\t0\t0\n";
    assert_eq!(from_status(zombie), (ProcState::Zombie, Some(80001)));
    let running = "Name:\tpython\nState:\tS (sleeping)\nPPid:\t1\n";
    assert_eq!(from_status(running), (ProcState::Running, Some(1)));
    // A status without the lines (a test's fake tree) is a process that runs.
    assert_eq!(from_status("Name:\tx\n"), (ProcState::Running, None));
}

#[test]
fn the_view_says_whether_proc_shows_the_hosts_processes() {
    let me = std::process::id().to_string();
    let init_ns = fs::read_link("/proc/self/ns/pid").unwrap();
    let real = if init_ns.to_str() == Some(INIT_PID_NS) {
        ProcView::Host
    } else {
        ProcView::Own
    };
    assert_eq!(view(Path::new("/proc")), real);

    let fake = |self_to: Option<&str>, ns: Option<&str>, init: bool| {
        let dir = tempfile::tempdir().unwrap();
        if let Some(to) = self_to {
            symlink(to, dir.path().join("self")).unwrap();
            fs::create_dir_all(dir.path().join(to).join("ns")).unwrap();
            if let Some(ns) = ns {
                symlink(ns, dir.path().join(to).join("ns/pid")).unwrap();
            }
        }
        if init {
            fs::create_dir_all(dir.path().join("1")).unwrap();
        }
        view(dir.path())
    };
    // Not a proc filesystem.
    assert_eq!(fake(None, None, false), ProcView::Unknown);
    // This process's own namespace: the initial one, or a container's.
    assert_eq!(fake(Some(&me), Some(INIT_PID_NS), true), ProcView::Host);
    assert_eq!(
        fake(Some(&me), Some("pid:[4026532199]"), true),
        ProcView::Own
    );
    assert_eq!(fake(Some(&me), None, true), ProcView::Unknown);
    // An outer namespace's /proc (the host's, mounted in a container): this process has
    // another pid there.
    assert_eq!(fake(Some("4000001"), None, true), ProcView::Host);
    // No pid 1: other users' processes are hidden (hidepid).
    assert_eq!(
        fake(Some("4000001"), Some(INIT_PID_NS), false),
        ProcView::Own
    );
}

/// A /proc/PID/stat line with `state`, `ppid` and `start`.
fn stat(state: char, ppid: u32, start: u64) -> String {
    let mut tail: Vec<String> = (5..=52).map(|_| "0".to_string()).collect();
    tail[22 - 5] = start.to_string();
    format!("77 (python) {state} {ppid} {}\n", tail.join(" "))
}

#[test]
fn a_cached_process_is_asked_again_whether_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("77");
    fs::create_dir(&p).unwrap();
    fs::write(
        p.join("status"),
        "Name:\tpython\nState:\tS (sleeping)\nPPid:\t50\n",
    )
    .unwrap();
    fs::write(p.join("stat"), stat('S', 50, 1000)).unwrap();
    let parent = dir.path().join("50");
    fs::create_dir(&parent).unwrap();
    fs::write(parent.join("status"), "Name:\ttorchrun\n").unwrap();
    let mut cache = ProcCache::with_root(dir.path().into()).with_recheck(Duration::ZERO);
    let look = |cache: &mut ProcCache| {
        cache.begin();
        let info = cache.get(77, || None);
        cache.end();
        info
    };
    let first = look(&mut cache);
    assert_eq!((first.state, first.ppid), (Some(ProcState::Running), None));
    // Unchanged: the same shared info.
    assert!(Arc::ptr_eq(&look(&mut cache), &first));
    // It exits; its parent does not reap it.
    fs::write(p.join("stat"), stat('Z', 50, 1000)).unwrap();
    let zombie = look(&mut cache);
    assert_eq!(zombie.state, Some(ProcState::Zombie));
    assert_eq!(
        (zombie.ppid, zombie.parent.as_deref()),
        (Some(50), Some("torchrun"))
    );
    assert_eq!(zombie.name.as_deref(), Some("python"));
    // Reaped, and the pid taken by another process: gone, and it stays gone.
    fs::write(p.join("stat"), stat('S', 1, 2000)).unwrap();
    let gone = look(&mut cache);
    assert_eq!((gone.state, gone.ppid), (Some(ProcState::Gone), None));
    fs::write(p.join("stat"), stat('S', 1, 1000)).unwrap();
    assert_eq!(look(&mut cache).state, Some(ProcState::Gone));
    // A pid /proc never had is gone from the first look.
    cache.begin();
    assert_eq!(cache.get(78, || None).state, Some(ProcState::Gone));
}

#[test]
fn a_real_zombie_a_reaped_child_and_a_live_one() {
    let mut zombie = Command::new("true").stdout(Stdio::null()).spawn().unwrap();
    let mut live = Command::new("sleep").arg("30").spawn().unwrap();
    // `true` exits at once; unreaped, it stays a zombie of this process.
    let pid = zombie.id();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap()
        .contains(") Z ")
    {
        assert!(std::time::Instant::now() < deadline, "no zombie");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut cache = ProcCache::new().with_recheck(Duration::ZERO);
    cache.begin();
    let z = cache.get(pid, || None);
    assert_eq!(z.state, Some(ProcState::Zombie));
    assert_eq!(z.ppid, Some(std::process::id()));
    assert!(z.parent.is_some());
    assert_eq!(
        cache.get(live.id(), || None).state,
        Some(ProcState::Running)
    );
    zombie.wait().unwrap();
    live.kill().unwrap();
    live.wait().unwrap();
    cache.begin();
    assert_eq!(cache.get(pid, || None).state, Some(ProcState::Gone));
    assert_eq!(cache.get(live.id(), || None).state, Some(ProcState::Gone));
}

#[test]
fn a_collection_rechecks_a_bounded_number_of_processes() {
    let dir = tempfile::tempdir().unwrap();
    let pids: Vec<u32> = (100..140).collect();
    for pid in &pids {
        let p = dir.path().join(pid.to_string());
        fs::create_dir(&p).unwrap();
        fs::write(p.join("status"), "Name:\tpython\nState:\tS (sleeping)\n").unwrap();
        fs::write(p.join("stat"), stat('S', 1, 1000)).unwrap();
    }
    let mut cache = ProcCache::with_root(dir.path().into()).with_recheck(Duration::ZERO);
    let zombies = |cache: &mut ProcCache| {
        cache.begin();
        let n = pids
            .iter()
            .filter(|p| cache.get(**p, || None).state == Some(ProcState::Zombie))
            .count();
        cache.end();
        n
    };
    assert_eq!(zombies(&mut cache), 0);
    for pid in &pids {
        fs::write(
            dir.path().join(pid.to_string()).join("stat"),
            stat('Z', 1, 1000),
        )
        .unwrap();
    }
    // At most 32 a collection, taking turns: every one within two.
    let first = zombies(&mut cache);
    assert!(first > 0 && first <= 32, "{first}");
    assert_eq!(zombies(&mut cache), 40);
}

#[test]
fn a_pid_taken_by_another_process_before_the_first_recheck_is_gone() {
    // Two real processes; the second takes the first's pid in a /proc whose entry 77 is a link
    // to one of them (the kernel hands a pid out again only after a wrap, which a test cannot
    // wait for). The first is read, exits, and its pid is taken before any recheck.
    let mut first = Command::new("sleep").arg("30").spawn().unwrap();
    let mut second = Command::new("sleep").arg("30").spawn().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let entry = dir.path().join("77");
    symlink(format!("/proc/{}", first.id()), &entry).unwrap();
    // Start times are in clock ticks: the second must start at a later tick than the first.
    let start = |pid: u32| parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).unwrap());
    while start(second.id()).unwrap().start == start(first.id()).unwrap().start {
        second.kill().unwrap();
        second.wait().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        second = Command::new("sleep").arg("30").spawn().unwrap();
    }
    let mut cache = ProcCache::with_root(dir.path().into()).with_recheck(Duration::from_secs(3600));
    cache.begin();
    assert_eq!(cache.get(77, || None).state, Some(ProcState::Running));
    cache.end();
    first.kill().unwrap();
    first.wait().unwrap();
    fs::remove_file(&entry).unwrap();
    symlink(format!("/proc/{}", second.id()), &entry).unwrap();
    // The first recheck comes now.
    let mut cache = cache.with_recheck(Duration::ZERO);
    cache.begin();
    let info = cache.get(77, || None);
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(
        info.state,
        Some(ProcState::Gone),
        "the new process is not the one listed"
    );
}
