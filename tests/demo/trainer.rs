//! One `gpumon demo-trainer` alone against a socket this test serves, playing the daemon: it
//! announces the `attribution` capability, answers an `attribute` request as the real client
//! does (its numbers agree with its own samples), and its OOM says what its samples said.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpumon::frontends::demo::profile::Profile;
use serde_json::{json, Value};

use super::BIN;

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// One `gpumon demo-trainer` child, killed when the test ends.
struct Trainer(Child);

impl Trainer {
    fn spawn(profile: &str, socket: &Path, t0: f64) -> Self {
        let child = Command::new(BIN)
            .args([
                "demo-trainer",
                "--profile",
                profile,
                "--gpu-uuid",
                "GPU-test",
            ])
            .arg("--socket")
            .arg(socket)
            .args(["--t0", &t0.to_string()])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Self(child)
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This test's end of one trainer connection, playing the daemon.
struct Conn {
    lines: BufReader<UnixStream>,
    out: UnixStream,
}

impl Conn {
    fn accept(l: &UnixListener) -> Self {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        Self {
            out: s.try_clone().unwrap(),
            lines: BufReader::new(s),
        }
    }

    /// The next line the trainer sent, None when it closed the connection.
    fn next(&mut self) -> Option<Value> {
        let mut line = String::new();
        if self.lines.read_line(&mut line).unwrap() == 0 {
            return None;
        }
        assert!(line.len() < 60_000, "line of {} bytes", line.len());
        // Every line is one the daemon's own parser takes.
        if let Err(e) = gpumon::sources::ingest::protocol::parse(line.trim_end().as_bytes()) {
            panic!("the daemon refuses {line}: {e:?}");
        }
        Some(serde_json::from_str(&line).unwrap())
    }

    fn send(&mut self, v: Value) {
        writeln!(self.out, "{v}").unwrap();
    }

    /// The hello, answered as the daemon answers it.
    fn hello(&mut self) -> Value {
        let hello = self.next().unwrap();
        assert_eq!(hello["type"], "hello");
        self.send(json!({"type": "welcome", "v": 1, "server": "test", "session": "s-1"}));
        hello
    }
}

fn listener() -> (tempfile::TempDir, PathBuf, UnixListener) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ingest.sock");
    let l = UnixListener::bind(&socket).unwrap();
    (dir, socket, l)
}

fn stat(v: &Value, key: &str) -> u64 {
    v["stats"][key].as_u64().unwrap()
}

/// Reads until the trainer's answer to request `id`, keeping each sample's live bytes by step.
fn answer(c: &mut Conn, id: u64, active: &mut HashMap<u64, u64>) -> Value {
    loop {
        let v = c.next().expect("the trainer closed before answering");
        match v["type"].as_str() {
            Some("sample") => {
                active.insert(
                    v["step"].as_u64().unwrap(),
                    stat(&v, "active_bytes.all.current"),
                );
            }
            Some("attribution") if v["id"] == id => return v,
            other => panic!("unexpected {other:?}: {v}"),
        }
    }
}

#[test]
fn the_leaking_demo_trainer_names_its_leak_when_asked() {
    let (_dir, socket, l) = listener();
    let _t = Trainer::spawn("leak", &socket, now());
    let mut c = Conn::accept(&l);
    let hello = c.hello();
    assert!(
        hello["caps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c == "attribution"),
        "{hello}"
    );
    let mut active = HashMap::new();
    samples(&mut c, &mut active, 3);

    // Steps bound the window: 10 steps at the demo's 5 a second.
    let asked = Instant::now();
    c.send(
        json!({"type": "attribute", "v": 1, "id": 7, "finding": "s-1/leak", "steps": 10,
        "seconds": 60, "max_entries": 4000, "top": 10}),
    );
    let a = answer(&mut c, 7, &mut active);
    let waited = asked.elapsed().as_secs_f64();
    println!("attribution of 10 steps answered after {waited:.2} s: {a}");
    let (from, to) = (
        a["step_from"].as_u64().unwrap(),
        a["step_to"].as_u64().unwrap(),
    );
    assert_eq!(to - from, 10);
    let seconds = a["seconds"].as_f64().unwrap();
    assert!((1.5..3.5).contains(&seconds), "{seconds}");
    // One recorded step before the window, then the window: about 2.2 s, never a stall.
    assert!(waited < 6.0, "{waited}");
    // The total is what the samples at those steps said.
    let total = a["total_growth_bytes"].as_u64().unwrap();
    assert_eq!(total, active[&to].saturating_sub(active[&from]));
    let sites = a["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 1, "{a}");
    let top = &sites[0];
    assert_eq!(top["file"], "/home/alice/proj/train.py");
    assert_eq!(top["line"], 27);
    assert_eq!(top["function"], "kept_outputs");
    let per_step = Profile::Leak.leak_per_step().unwrap();
    assert_eq!(top["blocks"].as_u64(), Some(10));
    assert_eq!(top["bytes"].as_u64(), Some(10 * per_step));
    // The site's growth is the samples' growth, give or take the floor's jitter (< 64 MiB).
    assert!(
        top["bytes"].as_u64().unwrap().abs_diff(total) < 64 << 20,
        "site {} vs samples {total}",
        top["bytes"]
    );
    // The stack as the real client sends it: the site's frame first, then the user's frames
    // outward (the fixture's train.py: kept_outputs called from run at line 48).
    let stack = top["stack"].as_array().unwrap();
    assert_eq!(
        (stack[0]["line"].as_u64(), stack[0]["function"].as_str()),
        (Some(27), Some("kept_outputs"))
    );
    assert_eq!(
        (stack[1]["line"].as_u64(), stack[1]["function"].as_str()),
        (Some(48), Some("run"))
    );
    assert!(stack
        .iter()
        .all(|f| f["file"] == "/home/alice/proj/train.py"));

    // One window at a time: a request while one is open is refused at once.
    c.send(
        json!({"type": "attribute", "v": 1, "id": 8, "steps": 10_000, "seconds": 1.0, "top": 10}),
    );
    c.send(json!({"type": "attribute", "v": 1, "id": 9, "steps": 10, "seconds": 60, "top": 10}));
    let refused = answer(&mut c, 9, &mut active);
    assert_eq!(refused["error"], "failed", "{refused}");

    // Seconds bound the first when they come first: 1 s is about 5 steps.
    let a = answer(&mut c, 8, &mut active);
    let steps = a["step_to"].as_u64().unwrap() - a["step_from"].as_u64().unwrap();
    assert!((4..=7).contains(&steps), "{a}");
    assert_eq!(a["sites"][0]["blocks"].as_u64(), Some(steps));
}

/// Reads `n` samples, keeping their live bytes by step.
fn samples(c: &mut Conn, active: &mut HashMap<u64, u64>, n: usize) {
    let mut seen = 0;
    while seen < n {
        let v = c.next().unwrap();
        if v["type"] == "sample" {
            active.insert(
                v["step"].as_u64().unwrap(),
                stat(&v, "active_bytes.all.current"),
            );
            seen += 1;
        }
    }
}

#[test]
fn a_healthy_demo_trainer_answers_with_no_sites() {
    let (_dir, socket, l) = listener();
    let _t = Trainer::spawn("healthy", &socket, now() - 100.0);
    let mut c = Conn::accept(&l);
    c.hello();
    c.send(json!({"type": "attribute", "v": 1, "id": 1, "steps": 5, "seconds": 60, "top": 10}));
    let mut active = HashMap::new();
    let a = answer(&mut c, 1, &mut active);
    assert_eq!(a["sites"].as_array().map(Vec::len), Some(0), "{a}");
    assert!(a.get("error").is_none());
}

#[test]
fn the_leaking_demo_trainer_runs_out_of_memory_as_its_samples_said() {
    let (_dir, socket, l) = listener();
    // Four seconds before the leak's run meets the limit.
    let period = Profile::Leak.period().unwrap();
    let _t = Trainer::spawn("leak", &socket, now() - (period - 4.0));
    let mut c = Conn::accept(&l);
    let hello = c.hello();
    // A window it will not live to close.
    c.send(json!({"type": "attribute", "v": 1, "id": 1, "steps": 1000, "seconds": 600, "top": 10}));
    let mut last: Option<Value> = None;
    let oom = loop {
        let v = c.next().expect("closed before the OOM");
        match v["type"].as_str() {
            Some("sample") => last = Some(v),
            Some("event") if v["kind"] == "oom" => break v,
            other => panic!("unexpected {other:?}: {v}"),
        }
    };
    let last = last.expect("no sample before the OOM");
    let (free, seen) = (
        oom["device_free"].as_u64().unwrap(),
        last["device_free"].as_u64().unwrap(),
    );
    println!(
        "OOM: {} free at the OOM, {} at the last sample (step {})",
        free, seen, last["step"]
    );
    // Within one step's change: the leak's 8 MiB plus the floor's jitter (< 64 MiB).
    assert!(free.abs_diff(seen) <= 72 << 20, "{free} vs {seen}");
    let alloc = oom["alloc_bytes"].as_u64().unwrap();
    assert!(free < alloc, "an OOM with {free} free for {alloc}");
    assert!(oom["ts"].as_f64().unwrap() >= last["ts"].as_f64().unwrap());
    assert!(oom["detail"]
        .as_str()
        .unwrap()
        .contains("Tried to allocate 2.00 GiB"));
    // No sample reports the OOM: the step never finished.
    assert_eq!(stat(&last, "num_ooms"), 0);

    let cut = c.next().unwrap();
    assert_eq!(
        (cut["type"].as_str(), cut["id"].as_u64()),
        (Some("attribution"), Some(1))
    );
    assert_eq!(cut["error"], "cut_short");
    assert!(
        cut["detail"]
            .as_str()
            .unwrap()
            .starts_with("trainer died: OutOfMemoryError: CUDA out of memory."),
        "{cut}"
    );
    let died = c.next().unwrap();
    assert_eq!(died["kind"], "mark");
    let text = died["detail"].as_str().unwrap();
    assert!(
        text.starts_with("trainer died: OutOfMemoryError: CUDA out of memory."),
        "{text}"
    );
    // Torch's message names the same free memory as the event.
    let of_which = format!(
        " of which {} is free",
        gpumon::frontends::demo::oom::human(free)
    );
    assert!(text.contains(&of_which), "{text}");
    // Then the connection closes without bye: a crash.
    assert!(c.next().is_none());

    // It restarts as a new session: step 0 again, the leaked memory given back.
    let mut c = Conn::accept(&l);
    let again = c.hello();
    assert_eq!(again["pid"], hello["pid"]);
    let first = c.next().unwrap();
    assert_eq!(first["type"], "sample");
    assert!(first["step"].as_u64().unwrap() < 10, "{first}");
    assert!(first["device_free"].as_u64().unwrap() > 30 << 30, "{first}");
}
