//! `gpumon demo` from an installed binary, with no flags: the binary copied alone into an empty
//! directory (as `cargo install` leaves it) finds the fake NVML library built into it, and laid
//! out as the Debian package installs it (bin/gpumon, lib/gpumon/libfake_nvml.so) finds the
//! package's copy first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{get, sample, BIN};

/// A headless demo started from `exe`; its stderr collected for the log line naming the library.
struct Demo {
    child: Child,
    url: String,
    log: Arc<Mutex<String>>,
}

impl Demo {
    fn start(exe: &Path) -> Result<Self, String> {
        let mut cmd = Command::new(exe);
        cmd.args(["demo", "--headless", "--listen", "127.0.0.1:0"])
            .env("GPUMON_CONFIG", "/dev/null")
            .env("GPUMON_LOG_LEVEL", "info")
            .env("NO_COLOR", "1")
            .env_remove("GPUMON_NVML_LIB")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = common::retry_busy(|| cmd.spawn()).unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let Some(url) = first.split_whitespace().find(|w| w.starts_with("http://")) else {
            let status = child.wait().unwrap();
            std::thread::sleep(Duration::from_millis(200));
            return Err(format!("{status}: {}", log.lock().unwrap()));
        };
        Ok(Self {
            url: url.to_string(),
            child,
            log,
        })
    }

    /// Waits for the simulated node in /metrics: NVML up through the fake library, two GPUs.
    fn serves_two_gpus(&self) {
        let start = Instant::now();
        loop {
            let m = get(&format!("{}/metrics", self.url)).1;
            let gpus = m
                .lines()
                .filter(|l| l.starts_with("gpumon_gpu_memory_total_bytes{"))
                .count();
            if sample(&m, "gpumon_nvml_up") == Some(1.0) && gpus == 2 {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no simulated node in /metrics: {m}\nlog: {}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The `fake NVML library` log line.
    fn library_line(&self) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self
                .log
                .lock()
                .unwrap()
                .lines()
                .find(|l| l.contains("fake NVML library"))
            {
                return l.to_string();
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no library line");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe {
                libc::kill(self.child.id() as i32, libc::SIGTERM);
            }
            let _ = self.child.wait();
        }
    }
}

fn copy_exe(dir: &Path, rel: &str) -> PathBuf {
    let exe = dir.join(rel);
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::fs::copy(BIN, &exe).unwrap();
    exe
}

#[test]
fn a_lone_binary_runs_the_demo_with_no_flags() {
    let dir = tempfile::tempdir().unwrap();
    let exe = copy_exe(dir.path(), "gpumon");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // An installed package on this machine would be found first (and is tested below).
    let packaged = Path::new("/usr/lib/gpumon/libfake_nvml.so").is_file();
    match Demo::start(&exe) {
        Ok(demo) => {
            assert!(cfg!(feature = "bundled-fake-nvml") || packaged);
            demo.serves_two_gpus();
            let line = demo.library_line();
            if !packaged {
                assert!(line.contains("built into the binary"), "{line}");
                assert!(
                    line.contains("/proc/self/fd/"),
                    "loaded from memory: {line}"
                );
            }
            // Nothing was unpacked beside the binary.
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        }
        // Built without the library, the demo says where it looked and how to get one.
        Err(why) => {
            assert!(!cfg!(feature = "bundled-fake-nvml") && !packaged, "{why}");
            assert!(why.contains(&dir.path().display().to_string()), "{why}");
            assert!(why.contains("/usr/lib/gpumon/libfake_nvml.so"), "{why}");
            assert!(why.contains("--nvml-lib"), "{why}");
        }
    }
}

#[test]
fn the_package_layout_finds_the_installed_library() {
    let root = tempfile::tempdir().unwrap();
    let exe = copy_exe(root.path(), "usr/bin/gpumon");
    let lib = root.path().join("usr/lib/gpumon/libfake_nvml.so");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    std::fs::copy(common::fake_lib(), &lib).unwrap();
    let demo = Demo::start(&exe).unwrap();
    demo.serves_two_gpus();
    let line = demo.library_line();
    assert!(line.contains(&lib.display().to_string()), "{line}");
    assert!(line.contains("installed"), "{line}");
}

#[test]
fn a_missing_explicit_library_is_an_error_naming_it() {
    let out = Command::new(BIN)
        .args(["demo", "--headless", "--nvml-lib", "/nonexistent/libx.so"])
        .env("GPUMON_CONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--nvml-lib /nonexistent/libx.so"), "{err}");
}
