use std::time::{Duration, Instant};

use super::*;

/// (state letter, parent pid, name) from /proc/PID/stat.
fn stat(pid: u32) -> Option<(char, u32, String)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = s.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_string();
    let mut f = rest.split_whitespace();
    Some((f.next()?.chars().next()?, f.next()?.parse().ok()?, name))
}

#[test]
fn the_launcher_leaves_a_real_zombie_named_python() {
    let dir = tempfile::tempdir().unwrap();
    let (mut launcher, pid) = spawn(dir.path()).expect("sh, true and sleep are on PATH");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let raw = std::fs::read_to_string(format!("/proc/{pid}/stat"));
        let (state, ppid, name) = stat(pid).unwrap_or_else(|| panic!("{pid}: {raw:?}"));
        let launcher_name = stat(launcher.id()).map(|s| s.2);
        if state == 'Z' && launcher_name.as_deref() == Some("torchrun") {
            assert_eq!((ppid, name.as_str()), (launcher.id(), "python"));
            break;
        }
        assert!(Instant::now() < deadline, "no zombie: {:?}", stat(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    launcher.kill().unwrap();
    launcher.wait().unwrap();
}

#[test]
fn its_lines_give_gpu_1_its_memory_until_it_is_freed() {
    let scen = format!("{}{}", super::super::scenario::toml(&[], &[]), toml(4242));
    let s = fake_nvml::Scenario::parse(&scen).unwrap();
    assert_eq!(GPU, super::super::scenario::UUIDS.len() - 1);
    let p = &s.gpus[GPU].processes[0];
    assert_eq!((p.pid, p.end), (4242, Some(FREED_AT)));
    assert!(shown(0.0) && !shown(FREED_AT));
}
