//! The terminal the TUI runs in: a private tmux server, keys in, the pane's text out, with
//! bounded waits.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::common::BIN;

/// A private tmux server (its own socket), so nothing of the user's tmux is touched.
pub struct Tmux {
    socket: PathBuf,
    conf: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmux {
    pub fn start() -> Option<Self> {
        if Command::new("tmux").arg("-V").output().is_err() {
            println!(
                "skipping: tmux is not installed (apt-get install tmux; scripts/check installs it)"
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("tmux.conf");
        std::fs::write(&conf, "set -g history-limit 0\n").unwrap();
        let socket = dir.path().join("tmux.sock");
        Some(Self {
            socket,
            conf,
            _dir: dir,
        })
    }

    pub fn cmd(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .env_remove("TMUX")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `gpumon tui ARGS` in a new 120x40 session named `name`, with `env` set. A shell
    /// stays behind it, so that once it exits the pane shows its exit status and the terminal
    /// modes it left behind can be read.
    pub fn tui(&self, name: &str, config: &std::path::Path, env: &[&str], args: &[&str]) {
        let mut line = format!("{BIN} --config {} tui", config.display());
        for a in args {
            line.push(' ');
            line.push_str(a);
        }
        self.run(name, (120, 40), env, &line);
    }

    /// Runs the shell command `line` in a new session named `name` of `size`, as `tui` does.
    pub fn run(&self, name: &str, (w, h): (u16, u16), env: &[&str], line: &str) {
        let line = format!("{line}; echo \"[exit $?]\"; exec sleep 600");
        let conf = self.conf.to_str().unwrap();
        let (w, h) = (w.to_string(), h.to_string());
        let mut cmd = vec![
            "-f",
            conf,
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            w.as_str(),
            "-y",
            h.as_str(),
        ];
        for e in env {
            cmd.extend(["-e", e]);
        }
        cmd.push(&line);
        self.cmd(&cmd);
    }

    pub fn pane(&self, name: &str) -> String {
        self.cmd(&["capture-pane", "-p", "-t", name])
    }

    pub fn format(&self, name: &str, fmt: &str) -> String {
        self.cmd(&["display-message", "-p", "-t", name, fmt])
            .trim()
            .to_string()
    }

    pub fn keys(&self, name: &str, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", name];
        args.extend(keys);
        self.cmd(&args);
    }

    pub fn wait(&self, name: &str, what: &str, cond: impl FnMut(&str) -> bool) -> String {
        self.wait_for(name, what, 15, cond)
    }

    pub fn wait_for(
        &self,
        name: &str,
        what: &str,
        secs: u64,
        mut cond: impl FnMut(&str) -> bool,
    ) -> String {
        let start = Instant::now();
        loop {
            let pane = self.pane(name);
            if cond(&pane) {
                return pane;
            }
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "timed out waiting for {what}; the pane shows:\n{pane}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_text(&self, name: &str, needle: &str) -> String {
        self.wait(name, &format!("{needle:?}"), |p| p.contains(needle))
    }

    /// Waits for every one of `parts` in one capture: a capture can catch a frame half drawn
    /// (its top rows new, the rest still the last frame's), so checking the parts one by one
    /// after waiting for the first is a race.
    pub fn wait_all(&self, name: &str, parts: &[&str]) -> String {
        self.wait(name, &format!("all of {parts:?}"), |p| {
            parts.iter().all(|x| p.contains(x))
        })
    }

    /// Resizes the window of session `name` to `w`x`h`, and waits for the TUI to redraw at that
    /// size (the box titled `title` spans the width, the footer is on the last row) with `cond`
    /// holding; the pane then.
    pub fn at_size(
        &self,
        name: &str,
        (w, h): (u16, u16),
        title: &str,
        what: &str,
        cond: impl Fn(&str) -> bool,
    ) -> String {
        let (ws, hs) = (w.to_string(), h.to_string());
        self.cmd(&["resize-window", "-t", name, "-x", &ws, "-y", &hs]);
        let drawn = |p: &str| {
            let lines: Vec<&str> = p.lines().collect();
            lines.len() == usize::from(h)
                && lines.last().is_some_and(|l| !l.trim().is_empty())
                && lines
                    .iter()
                    .any(|l| l.starts_with(title) && l.chars().count() == usize::from(w))
        };
        self.wait(name, &format!("{what} at {w}x{h}"), |p| drawn(p) && cond(p))
    }

    /// The TUI's exit status, once it has exited.
    pub fn wait_exit(&self, name: &str) -> i32 {
        let pane = self.wait(name, "the TUI to exit", |p| p.contains("[exit "));
        let status = pane
            .split("[exit ")
            .nth(1)
            .and_then(|r| r.split(']').next());
        status.and_then(|s| s.parse().ok()).unwrap()
    }

    /// The pid of the TUI: the child of the pane's shell.
    pub fn tui_pid(&self, name: &str) -> i32 {
        let sh = self.format(name, "#{pane_pid}");
        let children = std::fs::read_to_string(format!("/proc/{sh}/task/{sh}/children")).unwrap();
        children.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// After exit: the terminal is back to normal (main screen, no mouse reporting, cursor on).
    pub fn assert_restored(&self, name: &str) {
        let modes = self.format(
            name,
            "#{alternate_on} #{mouse_any_flag} #{mouse_button_flag} #{mouse_standard_flag} #{cursor_flag}",
        );
        assert_eq!(modes, "0 0 0 0 1", "alternate screen, mouse modes, cursor");
        // Raw mode is off: the shell's output has its newlines translated again.
        assert!(self.pane(name).contains("[exit "));
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}
