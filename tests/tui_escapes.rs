//! `gpumon tui` in a real terminal (tmux) against a node that speaks in hostile strings
//! (tests/common/hostile.rs): every byte the TUI writes is recorded (`pipe-pane`), and none is
//! a sequence or character a hostile string brought; the screen shows each string escaped.
//! Skipped, with the reason printed, only where tmux is not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/hostile.rs"]
mod hostile;
#[path = "common/hostile_node.rs"]
mod hostile_node;
// Shared with tests/tui_tmux.rs, which uses all of it.
#[allow(dead_code)]
#[path = "tui_tmux/tmux.rs"]
mod tmux;

use std::path::Path;

use gpumon::util::printable::printable;
use hostile::{first_escape, HOSTILE};
use hostile_node::{hostile_snapshot, missing, raw, serve};
use tmux::Tmux;

/// What the TUI itself never writes and a hostile string would: OSC (titles, links, the
/// clipboard), DCS, APC, PM, SOS, and BEL, which ends an OSC.
fn foreign_sequences(out: &[u8]) -> Vec<String> {
    let mut found = vec![];
    for w in out.windows(2) {
        if w[0] == 0x1b && b"]P_^X".contains(&w[1]) {
            found.push(format!("ESC {}", w[1] as char));
        }
    }
    if out.contains(&0x07) {
        found.push("BEL".into());
    }
    found
}

/// Starts `gpumon tui --connect ADDR` in session `name` once the pane's output is recorded to
/// `record`: the TUI draws each cell once and then only what changed, so the recording must
/// hold its first frame.
fn tui_recorded(tmux: &Tmux, name: &str, addr: &str, record: &Path) {
    let go = record.with_extension("go");
    let line = format!(
        "while [ ! -e {go} ]; do sleep 0.1; done; {bin} --config /dev/null tui --connect {addr} --refresh 300ms",
        go = go.display(),
        bin = common::BIN,
    );
    tmux.run(name, (160, 48), &[], &line);
    let pipe = format!("cat >> {}", record.display());
    tmux.cmd(&["pipe-pane", "-o", "-t", name, &pipe]);
    // pipe-pane has started its command once tmux returns; the file exists once cat opens it.
    let start = std::time::Instant::now();
    while !record.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(15),
            "no recording"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::fs::write(&go, "").unwrap();
}

#[test]
fn the_tui_shows_hostile_strings_escaped_and_writes_none_of_them() {
    let Some(tmux) = Tmux::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let snap = hostile_snapshot();
    let addr = serve(snap.to_string());
    let record = dir.path().join("main.out");
    tui_recorded(&tmux, "main", &addr, &record);

    // The trainers (jobs) on the Overview, then the processes (names, users, containers).
    let overview = tmux.wait_for("main", "every job escaped", 30, |p| missing(p).is_empty());
    tmux.keys("main", &["2"]);
    let procs = tmux.wait_for("main", "every process escaped", 30, |p| {
        p.contains("Processes") && missing(p).is_empty()
    });
    tmux.keys("main", &["q"]);
    assert_eq!(tmux.wait_exit("main"), 0);

    let out = std::fs::read(&record).unwrap();
    assert_eq!(foreign_sequences(&out), Vec::<String>::new());
    // ESC and the C0 controls the TUI writes itself are its own; anything else is not.
    let text = String::from_utf8_lossy(&out);
    let stray: Vec<String> = raw(text.replace(['\u{1b}', '\r', '\n', '\u{8}'], "").as_bytes());
    assert_eq!(stray, Vec::<String>::new());
    assert_ne!(tmux.format("main", "#{pane_title}"), "PWNED");
    for pane in [overview, procs] {
        assert_eq!(raw(pane.as_bytes()), Vec::<String>::new(), "{pane}");
        // What is left where ratatui drops a control character: the rest of its sequence.
        let residue = pane.replace("\\u{1b}]8;;", "").contains("]8;;");
        assert!(!residue, "the residue of a dropped escape:\n{pane}");
    }
}

/// A snapshot refused by serde (an enum holding a hostile string): the TUI says why, with the
/// string escaped.
#[test]
fn the_tui_shows_a_hostile_refusal_escaped() {
    let Some(tmux) = Tmux::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut snap = hostile_snapshot();
    let s = HOSTILE[1];
    snap["gpus"][0]["state"] = s.into();
    let addr = serve(snap.to_string());
    let record = dir.path().join("refused.out");
    tui_recorded(&tmux, "refused", &addr, &record);
    let shown = first_escape(&printable(s)).to_string();
    let pane = tmux.wait_for("refused", "the refusal", 30, |p| p.contains(&shown));
    assert!(pane.contains("unknown variant"), "{pane}");
    tmux.keys("refused", &["q"]);
    let _ = tmux.wait_exit("refused");
    let out = std::fs::read(&record).unwrap();
    assert_eq!(foreign_sequences(&out), Vec::<String>::new());
    assert_ne!(tmux.format("refused", "#{pane_title}"), "PWNED");
}
