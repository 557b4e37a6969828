//! `gpumon demo-trainer`: one simulated trainer, a real child process that pushes samples over the
//! real ingest socket, as an instrumented PyTorch loop would, and answers the daemon's
//! `attribute` requests. It dies with its parent.

use std::io::{BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use serde_json::json;

use super::attribution::{self, Mark, Request, Window};
use super::job::device_free;
use super::oom;
use super::profile::{sample_line, Profile, SplitCadence, STEPS_PER_SECOND};

/// Set by SIGTERM, SIGINT, SIGHUP or SIGQUIT: the demo stopping, Ctrl-C on its terminal (which
/// reaches the whole process group, the daemon included), or the parent's death signal.
static STOP: AtomicBool = AtomicBool::new(false);
/// How long a stopping trainer may take to say bye before it just exits.
const STOP_GRACE: Duration = Duration::from_secs(1);

pub fn run(profile: Profile, socket: &Path, gpu_uuid: &str, t0: f64) -> anyhow::Result<()> {
    // The demo's children must not outlive it, even when it is killed.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM));
    stop_on_signals();
    loop {
        let mut s = connect(socket);
        let hello = json!({
            "type": "hello", "v": 1, "pid": std::process::id(), "job": profile.job(), "rank": 0,
            "world_size": 1, "cuda_device": 0, "gpu_uuid": gpu_uuid,
            "client": concat!("gpumon-demo/", env!("CARGO_PKG_VERSION")), "torch": "2.5.1",
            "caps": ["attribution"],
        });
        if writeln!(s, "{hello}").is_err() {
            continue;
        }
        let requests = listen(&s);
        // The run live now ends in an OOM at this time (the leak only).
        let end = profile.oom_after(crate::core::model::now() - t0);
        let restarted = pump(&mut s, &requests, profile, t0, end);
        // Also ends the reading thread, which holds a clone of the socket.
        let _ = s.shutdown(Shutdown::Both);
        if !restarted {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// A trainer stopped on purpose ends its session with `bye`, as the real client does at exit,
/// so stopping the demo does not read as three crashes. Signals are taken on a thread of their
/// own (blocked everywhere else, before any thread starts); the loop says bye at its next turn.
pub(super) fn stop_on_signals() {
    let Ok(set) = crate::frontends::tui::terminal::block_signals() else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("demo-trainer-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` holds the blocked signals and `sig` is a valid out-pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                sig = libc::SIGTERM;
            }
            STOP.store(true, Ordering::SeqCst);
            // A trainer stuck in a write never gets to its bye: it goes anyway.
            std::thread::sleep(STOP_GRACE);
            std::process::exit(128 + sig);
        });
    if spawned.is_err() {
        // Nobody would take the signals: let them stop the process as they normally do.
        // SAFETY: pthread_sigmask only reads the set.
        unsafe {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        }
    }
}

/// Exits if a stop signal came, with a `bye` first when there is a connection to say it on.
pub(super) fn stop_if_asked(s: Option<&mut UnixStream>) {
    if !STOP.load(Ordering::SeqCst) {
        return;
    }
    if let Some(s) = s {
        let bye = json!({"type": "bye", "ts": crate::core::model::now()});
        let _ = writeln!(s, "{bye}");
        let _ = s.flush();
    }
    std::process::exit(0);
}

pub(super) fn connect(socket: &Path) -> UnixStream {
    loop {
        stop_if_asked(None);
        if let Ok(s) = UnixStream::connect(socket) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The daemon's requests, read on a thread of their own so a step never waits on the socket;
/// the thread ends when the connection does.
fn listen(s: &UnixStream) -> Receiver<Request> {
    let (tx, rx) = mpsc::channel();
    if let Ok(r) = s.try_clone() {
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { break };
                if let Some(req) = Request::parse(&line) {
                    if tx.send(req).is_err() {
                        break;
                    }
                }
            }
        });
    }
    rx
}

/// Sends samples until the socket breaks (false) or the leak's run ends in an OOM at `end` and
/// it "restarts" (true).
fn pump(
    s: &mut UnixStream,
    requests: &Receiver<Request>,
    profile: Profile,
    t0: f64,
    end: Option<f64>,
) -> bool {
    let gpu = profile.gpu();
    let mut last_step = None;
    let mut last_ts = 0.0f64;
    let mut window: Option<Window> = None;
    let mut splits = SplitCadence::default();
    loop {
        stop_if_asked(Some(s));
        let t = crate::core::model::now() - t0;
        if let Some(end) = end.filter(|e| t >= *e) {
            // The leak ran the GPU out of memory: the OOM, the open window cut short, and the
            // process goes down without bye (the daemon records the crash); it comes back as a
            // new session.
            // Stamped when it happened, never before the last sample.
            let ts = (t0 + end).max(last_ts);
            let why = oom::exception(profile, end);
            let _ = writeln!(s, "{}", oom::event(profile, end, ts));
            if let Some(w) = &window {
                let _ = writeln!(s, "{}", w.cut_short(ts, &format!("trainer died: {why}")));
            }
            let _ = writeln!(s, "{}", oom::died(&why, ts));
            return true;
        }
        let (step, stats) = profile.at(t);
        if last_step != Some(step) {
            last_step = Some(step);
            let ts = crate::core::model::now();
            last_ts = ts;
            let split = splits.at(profile, step);
            let sample = sample_line(ts, step, &stats, device_free(gpu, t), split.as_ref());
            if writeln!(s, "{sample}").is_err() {
                return false;
            }
            // As the real client: the window moves at samples, and requests are read then.
            let now = Mark {
                step,
                ts,
                active: stats.active.unwrap_or(0),
            };
            if let Some(answer) = window.as_mut().and_then(|w| w.on_step(profile, now)) {
                window = None;
                if writeln!(s, "{answer}").is_err() {
                    return false;
                }
            }
            while let Ok(req) = requests.try_recv() {
                // One window at a time, as the real client: a second request is refused at once.
                if let Some(open) = &window {
                    if writeln!(s, "{}", attribution::busy(&req, open, ts)).is_err() {
                        return false;
                    }
                } else {
                    window = Some(Window::new(req, step));
                }
            }
        }
        std::thread::sleep(Duration::from_secs_f64(1.0 / STEPS_PER_SECOND / 2.0));
    }
}
