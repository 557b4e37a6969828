//! `gpumon tui`, the real binary, in a real terminal (tmux) against the real daemon on the fake
//! NVML library, with a trainer pushing over the ingest socket: keys in, screen contents out.
//! Skipped, with the reason printed, only where tmux is not installed (scripts/check installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod identity;
#[path = "tui_tmux/jobs.rs"]
mod jobs;
#[path = "tui_tmux/tmux.rs"]
mod tmux;
#[path = "tui_tmux/unified.rs"]
mod unified;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use tmux::Tmux;

const GPU0: &str = "GPU-11111111-2222-3333-4444-555555555555";

/// The sizes the first look is checked at: the smallest usual terminal, then larger ones.
const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (160, 48)];

/// A line of the pane names the trainer `who` beside its finding's badge.
fn badged(pane: &str, who: &str, badge: &str) -> bool {
    pane.lines().any(|l| l.contains(who) && l.contains(badge))
}

/// The Findings list (above the selected one's pane) shows `text`.
fn listed(pane: &str, text: &str) -> bool {
    pane.split(" Selected ")
        .next()
        .is_some_and(|l| l.contains(text))
}

struct Trainer {
    w: UnixStream,
    /// The daemon's lines to this trainer (welcome, requests).
    r: BufReader<UnixStream>,
    step: u64,
    /// Unix time of step 0; steps are 50 ms apart from there.
    t0: f64,
}

impl Trainer {
    fn connect(d: &Daemon) -> Self {
        let w = UnixStream::connect(&d.socket).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let r = BufReader::new(w.try_clone().unwrap());
        let t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let mut t = Self { w, r, step: 0, t0 };
        t.send(&format!(
            "{{\"type\":\"hello\",\"v\":1,\"pid\":17,\"job\":\"llama-ft\",\"rank\":0,\"world_size\":8,\"gpu_uuid\":\"{GPU0}\",\"client\":\"test/1\",\"caps\":[\"attribution\"]}}"
        ));
        let mut welcome = String::new();
        t.r.read_line(&mut welcome).unwrap();
        assert!(welcome.contains("welcome"), "{welcome}");
        t
    }

    /// The daemon's `attribute` request, once it sent one (None if none came in 5 s).
    fn request(&mut self) -> Option<serde_json::Value> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.r.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["type"] == "attribute" {
                return Some(v);
            }
        }
    }

    /// Records the window it was asked for (its steps go by) and answers as the trainer of the
    /// kept-outputs snapshot pair does: 120 MiB in 120 blocks at train.py:27, all the growth.
    fn answer(&mut self, req: &serde_json::Value) {
        let from = self.step;
        self.steps(req["steps"].as_u64().unwrap());
        let frame = |line: u64, function: &str| {
            format!(
                r#"{{"file":"/home/alice/proj/train.py","line":{line},"function":"{function}"}}"#
            )
        };
        self.send(&format!(
            r#"{{"type":"attribution","id":{},"ts":{},"step_from":{from},"step_to":{},"total_growth_bytes":125829120,"sites":[{{"file":"/home/alice/proj/train.py","line":27,"function":"kept_outputs","bytes":125829120,"blocks":120,"stack":[{},{}]}}]}}"#,
            req["id"],
            self.t0 + self.step as f64 * 0.05,
            self.step,
            frame(27, "kept_outputs"),
            frame(48, "run"),
        ));
    }

    fn send(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).unwrap();
        self.w.write_all(b"\n").unwrap();
    }

    /// `n` steps of a leaking trainer: the floor is flat for 50 steps, then grows 64 MiB a step.
    fn steps(&mut self, n: u64) {
        for _ in 0..n {
            self.step("");
        }
    }

    /// The next step's sample, with `more` (",\"key\":value…") after its stats.
    fn step(&mut self, more: &str) {
        self.step += 1;
        let s = self.step;
        let floor = (8u64 << 30) + s.saturating_sub(50) * (64 << 20);
        let ts = self.t0 + s as f64 * 0.05;
        self.send(&format!(
            "{{\"type\":\"sample\",\"ts\":{ts},\"step\":{s},\"stats\":{{\"allocated_bytes.all.current\":{floor},\"allocated_bytes.all.peak\":{},\"reserved_bytes.all.current\":{},\"num_alloc_retries\":0}}{more}}}",
            floor + (4u64 << 30),
            floor + (6u64 << 30)
        ));
    }

    /// A step measured for the memory split (docs/categories.md): 2 + 2 + 4 GiB that do not
    /// scale, 3 GiB of activations at batch 16, and the device's figures the daemon fits the
    /// batch against.
    fn split(&mut self) {
        let gib = 1u64 << 30;
        self.step(&format!(
            ",\"device_free\":{},\"device_total\":{},\"categories\":{{\"step\":{},\"parameters_bytes\":{},\"gradients_bytes\":{},\"optimizer_state_bytes\":{},\"buffers_bytes\":0,\"activations_bytes\":{},\"batch_size\":16}}",
            20 * gib,
            80 * gib,
            self.step + 1,
            2 * gib,
            2 * gib,
            4 * gib,
            3 * gib
        ));
    }
}

#[test]
fn watch_a_trainer_climb_then_lose_the_daemon_and_quit_cleanly() {
    let Some(tmux) = Tmux::start() else { return };
    let config = empty_config();
    let d = Daemon::with_scenario("two_gpus");
    let mut trainer = Trainer::connect(&d);
    trainer.steps(60);
    let addr = d.addr.to_string();
    tmux.tui(
        "main",
        config.path(),
        &[],
        &["--connect", &addr, "--refresh", "200ms"],
    );

    let pane = tmux.wait_all(
        "main",
        &[
            "GPU 0 · NVIDIA H100 80GB HBM3",
            "GPU 1 · NVIDIA H100 80GB HBM3",
            "21.0 GiB",
        ],
    );
    assert!(pane.contains(&format!("daemon 0.1.0 at {addr}")), "{pane}");
    tmux.wait_text("main", "ingest 1 conn");

    // Processes: the trainer, by the host pid the kernel gave the daemon and its own pid 17.
    tmux.keys("main", &["2"]);
    let me = std::process::id();
    tmux.wait_text("main", "Processes 5 of 5");
    let pane = tmux.wait_text("main", "llama-ft r0/8");
    assert!(pane.contains(&format!("{me} (17)")), "pid {me}:\n{pane}");
    assert!(pane.contains("torchrun") && pane.contains("Xorg"), "{pane}");

    // Filter to it, open it, and watch the step count follow the trainer.
    tmux.keys("main", &["/", "llama", "Enter"]);
    tmux.wait_text("main", "Processes 1 of 5");
    tmux.keys("main", &["Enter"]);
    // 60 steps: 10 of growth at 64 MiB.
    let pane = tmux.wait_all("main", &["step 60 · train", "floor 8.6 GiB"]);
    assert!(
        pane.contains(&format!("llama-ft rank 0 · pid {me} (ns 17) · GPU 0")),
        "{pane}"
    );
    trainer.steps(40);
    tmux.wait_all("main", &["step 100 · train", "floor 11.1 GiB"]);
    // A step measured for the memory split: drawn above the chart with the batch that fits.
    trainer.split();
    tmux.wait_all(
        "main",
        &[
            "split at step 101, peak 15.2 GiB",
            "█ parameters 2.0 GiB  ▓ gradients 2.0 GiB  ▒ optimizer state 4.0 GiB",
            "░ activations 3.0 GiB  ▪ other 4.2 GiB",
            "batch 16 now · ",
            " fits (scaled from batch 16)",
        ],
    );

    // Past the leak detector's warm-up (256 steps) and its first verdict (13 segments of 4),
    // the leak is flagged and explained right here.
    trainer.steps(200);
    let flagged = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        trainer.steps(1);
        d.snapshot()["findings"].as_array().is_some_and(|f| {
            f.iter()
                .any(|f| f["kind"] == "leak" && f["state"] == "firing")
        })
    });
    assert!(flagged, "no leak finding by step {}", trainer.step);
    tmux.wait_text("main", "▲ leak");
    // The daemon asks where the growth is allocated; once the trainer answers, the detail lists
    // the site under the finding.
    let req = trainer
        .request()
        .expect("the daemon asks a trainer that can attribute");
    assert!(req["finding"].as_str().unwrap().ends_with("/leak"), "{req}");
    trainer.answer(&req);
    tmux.wait_all(
        "main",
        &[
            "train.py:27 kept_outputs",
            " 100%  120.0 MiB  train.py:27",
            "Allocated at · 120.0 MiB grew in steps",
        ],
    );

    // At every size, the Overview names the trainer beside its badge, and Findings keep the
    // line that allocated the leak.
    tmux.keys("main", &["BSpace", "1"]);
    for size in SIZES {
        tmux.at_size("main", size, "┌ Trainers", "the leak's badge", |p| {
            badged(p, "llama-ft r0/8", " leak")
        });
    }
    tmux.keys("main", &["3"]);
    for size in SIZES {
        tmux.at_size("main", size, "┌ Findings", "the named line", |p| {
            listed(p, " at train.py:27 in kept_outputs")
        });
    }

    // At 80x24 the selected finding's pane keeps what to do: the end of the leak's hint.
    tmux.at_size("main", (80, 24), "┌ Selected", "the leak's remedy", |p| {
        p.split(" Selected ").nth(1).is_some_and(|s| {
            ["hint:", "`loss.detach()`", "instead"]
                .iter()
                .all(|w| s.contains(w))
        })
    });

    tmux.keys("main", &["?"]);
    tmux.wait_text("main", "gpumon tui: keys");
    // `?` again: every column and word the screens abbreviate, then any key closes.
    tmux.keys("main", &["?"]);
    tmux.wait_all("main", &["columns and words", "PID (NS)", "unsent"]);
    tmux.keys("main", &["x"]);
    tmux.wait("main", "help closed", |p| !p.contains("columns and words"));

    // The daemon goes away: the TUI says so and keeps retrying instead of crashing.
    drop(trainer);
    d.stop();
    let pane = tmux.wait_text("main", "DISCONNECTED");
    assert!(pane.contains("retrying in"), "{pane}");
    assert!(!pane.contains("[exit "), "{pane}");

    tmux.keys("main", &["q"]);
    assert_eq!(tmux.wait_exit("main"), 0);
    tmux.assert_restored("main");
}

#[test]
fn sigterm_restores_the_terminal_and_no_daemon_means_in_process_nvml() {
    let Some(tmux) = Tmux::start() else { return };
    let config = empty_config();
    // No daemon listens at this address: the TUI reads the fake NVML itself and says so.
    let scenario = scenario("two_gpus");
    let lib = fake_lib();
    let args = [
        "--listen",
        "127.0.0.1:9",
        "--nvml-lib",
        lib.to_str().unwrap(),
    ];
    let env = format!("FAKE_NVML_SCENARIO={}", scenario.display());
    tmux.tui("local", config.path(), &[&env], &args);
    let pane = tmux.wait_text("local", "GPU 1 · NVIDIA H100 80GB HBM3");
    assert!(pane.contains("in-process NVML"), "{pane}");
    assert!(
        pane.contains("ingest and findings unavailable (no daemon at 127.0.0.1:9)"),
        "{pane}"
    );
    tmux.keys("local", &["3"]);
    tmux.wait_text("local", "Findings are unavailable");
    assert_eq!(tmux.format("local", "#{alternate_on}"), "1");

    let pid = tmux.tui_pid("local");
    // SAFETY: a plain kill(2) of the TUI process, which this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(tmux.wait_exit("local"), 143, "128 + SIGTERM");
    tmux.assert_restored("local");
}

/// `gpumon demo`, started late in the leaking trainer's run (`--skip`) so that it runs out of
/// memory 25 s in: the OOM is listed with its pattern, and its trainer's detail explains it (the
/// line that asked, the line holding the memory, why and what to do), as the demo's trainer
/// sent it. 160x48, where the detail has room for the whole explanation; before that, the
/// Overview at each of `SIZES`.
#[test]
fn the_demo_s_oom_reads_explained_in_the_tui() {
    let Some(tmux) = Tmux::start() else { return };
    let skip = gpumon::frontends::demo::profile::Profile::Leak
        .period()
        .unwrap()
        - 25.0;
    tmux.run(
        "demo",
        (160, 48),
        &["GPUMON_CONFIG=/dev/null"],
        &format!("{BIN} demo --listen 127.0.0.1:0 --skip {skip:.3}"),
    );
    tmux.wait_for("demo", "the demo's TUI", 30, |p| p.contains("demo-leak"));
    // The near-limit trainer is flagged within seconds: at every size, the Overview lists it
    // with its badge (80x24 first, where the GPU blocks shrink to leave the table its rows),
    // and 160x48 last, for the explanation below.
    tmux.wait_for("demo", "the near-limit finding", 30, |p| {
        badged(p, "demo-near-limit r0/1", " near")
    });
    for size in SIZES {
        tmux.at_size("demo", size, "┌ Trainers", "the near-limit badge", |p| {
            badged(p, "demo-near-limit r0/1", " near") && p.contains("demo-leak r0/1")
        });
    }
    tmux.keys("demo", &["3"]);
    // Listed with its pattern; resolved once the trainer has restarted.
    tmux.wait_for("demo", "the demo's OOM", 90, |p| p.contains(" oom leak "));
    // Select the OOM: the pane below the list shows the selected finding. The list moves while
    // the trainer restarts (its crash fires, then resolves; the OOM, held firing as the cause,
    // goes above the older near-limit finding), and the selection follows the finding it is
    // on: from the top, then down, again until the OOM is the one.
    let selected = |p: &str| {
        p.split(" Selected ")
            .nth(1)
            .is_some_and(|s| s.contains("oom leak"))
    };
    for i in 0..20 {
        if selected(&tmux.pane("demo")) {
            break;
        }
        tmux.keys("demo", &[if i % 4 == 0 { "Home" } else { "Down" }]);
        std::thread::sleep(Duration::from_millis(300));
    }
    let pane = tmux.wait("demo", "the OOM selected", selected);
    assert!(
        pane.contains("fix: store loss.item() or loss.detach() at train.py:27"),
        "{pane}"
    );
    tmux.keys("demo", &["Enter"]);
    let parts = [
        "demo-leak rank 0",
        "▲ oom leak critical",
        "OOM explained: leak",
        "2.0 GiB asked at train.py:49 in run",
        "train.py:27 kept_outputs · ",
        "← train.py:48 in run",
        "why: live memory is dominated by blocks allocated at train.py:27 across",
        "fix: store loss.item() or loss.detach() at train.py:27 instead of the tensor",
    ];
    // The Findings screen's preview shows the same title: wait for the detail's footer too.
    tmux.wait_all("demo", &[&parts[..], &["esc back"]].concat());
    tmux.keys("demo", &["q"]);
    assert_eq!(tmux.wait_exit("demo"), 0);
}
