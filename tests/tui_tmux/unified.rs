//! A unified-memory GPU (the fake library's GB10-shaped `gb10` scenario) in the TUI: the GPU's
//! block says it is unified, with its processes' sum as used and the host's MemAvailable, read
//! from a /proc the test sets, as the room left; the process list shows both processes.

use super::common::*;
use super::tmux::Tmux;

const GIB: u64 = 1 << 30;

#[test]
fn a_unified_gpu_reads_as_unified_in_the_tui() {
    let Some(tmux) = Tmux::start() else { return };
    let proc_dir = tempfile::tempdir().unwrap();
    std::fs::write(proc_dir.path().join("stat"), "cpu 0 0 0 0 0 0 0 0 0 0\n").unwrap();
    std::fs::write(
        proc_dir.path().join("meminfo"),
        format!(
            "MemTotal: {} kB\nMemAvailable: {} kB\n",
            128 * GIB / 1024,
            40 * GIB / 1024
        ),
    )
    .unwrap();
    let gb10 = scenario("gb10");
    let d = Daemon::start(DaemonOpts {
        scenario: Some(&gb10),
        args: DaemonOpts::default_args_and(vec![
            "--procfs".into(),
            proc_dir.path().display().to_string(),
        ]),
        ..DaemonOpts::default()
    });
    let config = empty_config();
    let addr = d.addr.to_string();
    tmux.tui(
        "gb10",
        config.path(),
        &[],
        &["--connect", &addr, "--refresh", "200ms"],
    );
    // 20 + 4 GiB used by the two processes, 40 GiB available on the host: 64 GiB in all.
    let pane = tmux.wait_all(
        "gb10",
        &[
            "GPU 0 · NVIDIA GB10 unified",
            "used 24.0 GiB",
            "free 40.0 GiB (host MemAvailable)",
            "of 64.0 GiB unified",
        ],
    );
    assert!(!pane.contains("reserved"), "{pane}");
    tmux.keys("gb10", &["2"]);
    tmux.wait_all("gb10", &["Processes 2 of 2", "6100", "6101"]);
    tmux.keys("gb10", &["q"]);
    assert_eq!(tmux.wait_exit("gb10"), 0);
}
