//! The runs a recording daemon is shown, one per finding kind and cross-session rule. Each
//! waits until the daemon has judged what it was sent, so the story read after them is the one
//! the daemon told, not a race with its batches.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::common::Daemon;
use super::trainer::{now, Hello, Step, Trainer, GIB, MIB, TOTAL};

fn flat(extra: u64) -> impl Fn(u64) -> Step {
    move |_| Step {
        allocated: 20 * GIB,
        peak: (30 + extra) * GIB,
        reserved: 40 * GIB,
        retries: 0,
        device_free: 40 * GIB,
    }
}

fn none(_: u64) -> String {
    String::new()
}

pub fn job(d: &Daemon, name: &str, run: Option<&str>) -> Value {
    d.snapshot()["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == name && j["run_id"].as_str() == run)
        .cloned()
        .unwrap_or(Value::Null)
}

fn firing(d: &Daemon, job: &str, kind: &str) -> Option<Value> {
    d.snapshot()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["job"] == job && f["kind"] == kind && f["state"] == "firing")
        .cloned()
}

fn rank(
    socket: &Path,
    job: &'static str,
    run: Option<&'static str>,
    r: u64,
    world: u64,
) -> Trainer {
    let hello = Hello {
        job,
        run_id: run,
        rank: Some(r),
        world_size: Some(world),
        gpu_uuid: format!("GPU-{job}-{r}"),
        extra: vec![],
    };
    Trainer::connect(socket, &hello, 100 + r as u32)
}

/// 8 ranks of one run; rank 5 runs out of memory and dies, and the other 7 are taken down
/// within the cascade window: one cause, seven consequences.
pub fn cascade(d: &Daemon, job_name: &'static str, run: &'static str) {
    let mut ranks: Vec<Trainer> = (0..8)
        .map(|r| rank(&d.socket, job_name, Some(run), r, 8))
        .collect();
    for (r, t) in ranks.iter_mut().enumerate() {
        t.steps(1, 20, 1.0, flat(r as u64), none);
    }
    d.wait_for(Duration::from_secs(10), "8 ranks", || {
        job(d, job_name, Some(run))["ranks"]
            .as_array()
            .is_some_and(|r| r.len() == 8)
    });
    let mut five = ranks.remove(5);
    five.oom(2 * GIB, 100 * MIB, "");
    std::thread::sleep(Duration::from_millis(200));
    five.die();
    std::thread::sleep(Duration::from_millis(300));
    // Apart by more than the recorder's millisecond, so their order is on record.
    for t in ranks.drain(..) {
        t.die();
        std::thread::sleep(Duration::from_millis(20));
    }
    d.wait_for(Duration::from_secs(10), "the cascade judged", || {
        job(d, job_name, Some(run))["consequences"]
            .as_array()
            .is_some_and(|c| c.len() == 7)
    });
}

/// A job without run_id, 2 ranks: rank 1 crashes first, rank 0 after it.
pub fn no_run_id(d: &Daemon) {
    let mut one = rank(&d.socket, "norun", None, 1, 2);
    let mut zero = rank(&d.socket, "norun", None, 0, 2);
    one.steps(1, 10, 1.0, flat(1), none);
    zero.steps(1, 10, 1.0, flat(0), none);
    d.wait_for(Duration::from_secs(10), "2 ranks", || {
        job(d, "norun", None)["ranks"]
            .as_array()
            .is_some_and(|r| r.len() == 2)
    });
    one.die();
    std::thread::sleep(Duration::from_millis(300));
    zero.die();
    d.wait_for(Duration::from_secs(10), "rank 0 a consequence", || {
        job(d, "norun", None)["consequences"]
            .as_array()
            .is_some_and(|c| c.len() == 1)
    });
}

fn leak_step(step: u64) -> Step {
    let floor = 2 * GIB + step * 4 * MIB;
    Step {
        allocated: floor,
        peak: floor + GIB,
        reserved: floor + GIB,
        retries: 0,
        device_free: TOTAL - floor - GIB,
    }
}

/// A leak of 4 MiB a step whose trainer offers attribution: asked, it names train.py:27.
pub fn attributed_leak(d: &Daemon) {
    let hello = Hello {
        job: "leaky",
        rank: Some(0),
        gpu_uuid: "GPU-leaky".into(),
        extra: vec![r#""caps":["attribution"]"#.into()],
        ..Hello::default()
    };
    let mut t = Trainer::connect(&d.socket, &hello, 7);
    t.steps(1, 600, 0.1, leak_step, none);
    let req = t.read();
    assert_eq!(req["type"], "attribute", "{req}");
    let ts = t.ts();
    t.send(&format!(
        r#"{{"type":"attribution","id":{},"ts":{ts:.3},"step_from":580,"step_to":600,"seconds":2.0,"total_growth_bytes":104857600,"sites":[{{"file":"/home/alice/proj/train.py","line":27,"function":"kept_outputs","bytes":97517568,"blocks":20,"stack":[{{"file":"/home/alice/proj/train.py","line":27,"function":"kept_outputs"}},{{"file":"/home/alice/proj/train.py","line":48,"function":"run"}}]}}]}}"#,
        req["id"]
    ));
    d.wait_for(Duration::from_secs(10), "the leak attributed", || {
        firing(d, "leaky", "leak").is_some_and(|f| f.get("attribution").is_some())
    });
    t.steps(601, 700, 0.1, leak_step, none);
    t.bye();
}

/// The memory split a Megatron-style trainer measures (docs/categories.md), at `step`.
fn categories(step: u64) -> String {
    if step % 50 != 0 {
        return String::new();
    }
    format!(
        r#","categories":{{"step":{step},"parameters_bytes":{},"gradients_bytes":{},"optimizer_state_bytes":{},"buffers_bytes":1048576,"activations_bytes":{},"batch_size":16,"fp32_bytes":{},"partial":["main_grad: 291 parameters keep their gradient in main_grad (Megatron): counted from it, the whole gradient buffer once"]}}"#,
        12 * GIB,
        12 * GIB,
        24 * GIB,
        20 * GIB,
        24 * GIB
    )
}

/// A trainer at its limit: the allocator retries every 25 steps with 1 GiB free; it measures
/// its memory split every 50 steps.
pub fn near_limit(d: &Daemon) {
    let hello = Hello {
        job: "tight",
        rank: Some(0),
        gpu_uuid: "GPU-tight".into(),
        ..Hello::default()
    };
    let mut t = Trainer::connect(&d.socket, &hello, 8);
    let at = |step: u64| Step {
        allocated: 52 * GIB,
        peak: 74 * GIB + (step % 7) * MIB,
        reserved: 78 * GIB,
        retries: step / 25,
        device_free: GIB,
    };
    t.steps(1, 400, 0.1, at, categories);
    d.wait_for(Duration::from_secs(10), "near_limit with its split", || {
        firing(d, "tight", "near_limit").is_some_and(|f| !f["evidence"]["categories"].is_null())
    });
    t.bye();
}

/// A capped trainer explains its OOM (the fixture's explanation: fragmentation at oomlib.py:37)
/// and goes on.
pub fn explained_oom(d: &Daemon, fixtures: &Path) {
    let hello = Hello {
        job: "explained",
        rank: Some(0),
        gpu_uuid: "GPU-explained".into(),
        extra: vec![
            r#""caps":["oom_history"]"#.into(),
            r#""alloc_limit":4294967296"#.into(),
        ],
        ..Hello::default()
    };
    let event: Value =
        std::fs::read_to_string(fixtures.join("protocol/client_oom_explained.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|v| v["kind"] == "oom")
            .unwrap();
    let mut t = Trainer::connect(&d.socket, &hello, 9);
    let at = |_| Step {
        allocated: 1_389_363_200,
        peak: 2_710_568_960,
        reserved: 3_844_079_616,
        retries: 0,
        device_free: 80_386_129_920,
    };
    t.steps(1, 20, 0.25, at, none);
    let extra = format!(
        r#","alloc_limit":4294967296,"explanation":{}"#,
        event["explanation"]
    );
    t.oom(1_610_612_736, 80_386_129_920, &extra);
    t.steps(21, 22, 0.25, at, none);
    d.wait_for(
        Duration::from_secs(10),
        "the OOM explained, the run on",
        || {
            d.snapshot()["findings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| {
                    f["job"] == "explained"
                        && f["kind"] == "oom"
                        && f["evidence"]["survived"] == true
                })
        },
    );
    t.bye();
}

/// Reserved creeps 138 MiB a step while allocated stays flat: the cache, not a leak.
pub fn cache_growth(d: &Daemon) {
    let hello = Hello {
        job: "cache",
        rank: Some(0),
        gpu_uuid: "GPU-cache".into(),
        extra: vec![r#""alloc_conf":"max_split_size_mb:128,expandable_segments:True""#.into()],
        ..Hello::default()
    };
    let mut t = Trainer::connect(&d.socket, &hello, 10);
    let at = |i: u64| {
        let a = GIB + (i % 7) * 9 * MIB;
        let r = 2 * GIB + 138 * MIB * i;
        Step {
            allocated: a,
            peak: a + 512 * MIB,
            reserved: r,
            retries: 0,
            device_free: TOTAL - r - 600 * MIB,
        }
    };
    t.steps(0, 540, 0.1, at, none);
    d.wait_for(Duration::from_secs(10), "cache_growth", || {
        firing(d, "cache", "cache_growth").is_some()
    });
    t.bye();
}

/// Two ranks stopped by SIGTERM (scancel, preemption): a stopped job, no page.
pub fn stopped(d: &Daemon) {
    let mut zero = rank(&d.socket, "stopme", Some("run-s"), 0, 2);
    let mut one = rank(&d.socket, "stopme", Some("run-s"), 1, 2);
    zero.steps(1, 10, 1.0, flat(0), none);
    one.steps(1, 10, 1.0, flat(1), none);
    d.wait_for(Duration::from_secs(10), "2 ranks", || {
        job(d, "stopme", Some("run-s"))["ranks"]
            .as_array()
            .is_some_and(|r| r.len() == 2)
    });
    zero.signalled("SIGTERM");
    std::thread::sleep(Duration::from_millis(100));
    zero.die();
    std::thread::sleep(Duration::from_millis(300));
    one.signalled("SIGTERM");
    std::thread::sleep(Duration::from_millis(100));
    one.die();
    d.wait_for(Duration::from_secs(10), "the job stopped", || {
        job(d, "stopme", Some("run-s"))["state"] == "stopped"
            && job(d, "stopme", Some("run-s"))["members"]
                .as_array()
                .is_some_and(|m| m.iter().all(|m| !m["ended"].is_null()))
    });
}

/// Seconds since the Unix epoch, for a caller's own lines.
pub fn ts() -> f64 {
    now()
}

/// Rank `r` of the run `resumed`, numbering its lines for acknowledgements under a fixed
/// `instance`: after a daemon restart the same client says hello again and numbers on.
pub fn resuming_rank(socket: &Path, r: u64, position: (u64, f64)) -> Trainer {
    let hello = Hello {
        job: "resumed",
        run_id: Some("run-r"),
        rank: Some(r),
        world_size: Some(2),
        gpu_uuid: format!("GPU-resumed-{r}"),
        extra: vec![
            r#""caps":["ack"]"#.into(),
            format!(r#""instance":"resumed-{r}""#),
        ],
    };
    Trainer::connect(socket, &hello, 200 + r as u32).numbered(position.0, position.1)
}

/// A trainer whose leak spans a daemon restart (`instance` `spans`): 200 steps of it before,
/// 200 after, each daemon too few to raise it, the run as a whole enough.
pub fn spanning(socket: &Path, position: (u64, f64)) -> Trainer {
    let hello = Hello {
        job: "spans",
        rank: Some(0),
        gpu_uuid: "GPU-spans".into(),
        extra: vec![r#""caps":["ack"]"#.into(), r#""instance":"spans""#.into()],
        ..Hello::default()
    };
    Trainer::connect(socket, &hello, 300).numbered(position.0, position.1)
}

pub fn spanning_steps(t: &mut Trainer, from: u64, to: u64) {
    t.steps(from, to, 0.01, leak_step, none);
}

/// The run `resumed` before the restart: both ranks train 30 steps; and the first half of the
/// spanning leak (the last trainer returned).
pub fn before_restart(d: &Daemon) -> Vec<Trainer> {
    let mut ranks: Vec<Trainer> = (0..2)
        .map(|r| resuming_rank(&d.socket, r, (0, 0.0)))
        .collect();
    for (r, t) in ranks.iter_mut().enumerate() {
        t.steps(1, 30, 0.5, flat(r as u64), none);
    }
    let mut spans = spanning(&d.socket, (0, 0.0));
    spanning_steps(&mut spans, 1, 200);
    ranks.push(spans);
    d.wait_for(Duration::from_secs(10), "2 ranks at step 30", || {
        d.snapshot()["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| {
                (s["job"] == "resumed" && s["step"] == 30)
                    || (s["job"] == "spans" && s["step"] == 200)
            })
            .count()
            == 3
    });
    ranks
}

/// After the restart: the spanning leak resumes for its second half and ends; both ranks
/// resume, train 30 steps more; rank 1 runs out of memory and dies, rank 0 is taken down
/// after it.
pub fn after_restart(d: &Daemon, positions: &[(u64, f64)]) {
    let mut spans = spanning(&d.socket, positions[2]);
    spanning_steps(&mut spans, 201, 400);
    spans.bye();
    let mut ranks: Vec<Trainer> = positions[..2]
        .iter()
        .enumerate()
        .map(|(r, p)| resuming_rank(&d.socket, r as u64, *p))
        .collect();
    for (r, t) in ranks.iter_mut().enumerate() {
        t.steps(31, 60, 0.1, flat(r as u64), none);
    }
    d.wait_for(Duration::from_secs(10), "2 ranks again", || {
        job(d, "resumed", Some("run-r"))["ranks"]
            .as_array()
            .is_some_and(|r| r.len() == 2)
    });
    let mut one = ranks.remove(1);
    one.oom(2 * GIB, 100 * MIB, "");
    std::thread::sleep(Duration::from_millis(200));
    one.die();
    std::thread::sleep(Duration::from_millis(300));
    ranks.remove(0).die();
    d.wait_for(Duration::from_secs(10), "the run failed", || {
        job(d, "resumed", Some("run-r"))["consequences"]
            .as_array()
            .is_some_and(|c| c.len() == 1)
    });
}

/// 8 ranks of one run over two nodes, 4 on each; rank 5 (node-b) runs out of memory and dies,
/// and the other 7 follow. Each daemon judges what it sees: node-a only crashes.
pub fn cascade_over(a: &Daemon, b: &Daemon, job_name: &'static str, run: &'static str) {
    let mut ranks: Vec<Trainer> = (0..8)
        .map(|r| {
            rank(
                if r < 4 { &a.socket } else { &b.socket },
                job_name,
                Some(run),
                r,
                8,
            )
        })
        .collect();
    for (r, t) in ranks.iter_mut().enumerate() {
        t.steps(1, 20, 1.0, flat(r as u64), none);
    }
    for d in [a, b] {
        d.wait_for(Duration::from_secs(10), "4 ranks on each node", || {
            job(d, job_name, Some(run))["ranks"]
                .as_array()
                .is_some_and(|r| r.len() == 4)
        });
    }
    let mut five = ranks.remove(5);
    five.oom(2 * GIB, 100 * MIB, "");
    std::thread::sleep(Duration::from_millis(200));
    five.die();
    // The others a second after the OOM: past the clocks' tolerance (0.5 s), so their order is
    // known both live and from the recorder's milliseconds, which could round a failure right at
    // the tolerance to either side of it.
    std::thread::sleep(Duration::from_millis(800));
    for t in ranks.drain(..) {
        t.die();
        std::thread::sleep(Duration::from_millis(20));
    }
    for (d, n) in [(a, 3), (b, 3)] {
        d.wait_for(Duration::from_secs(10), "each node judged", || {
            let j = job(d, job_name, Some(run));
            j["state"] == "failed" && j["consequences"].as_array().is_some_and(|c| c.len() == n)
        });
    }
}

/// NVML's figure for the untracked trainer's process: its reserved 10 GiB, a 1 GiB context, and
/// 400 MiB a second more outside the allocator for the first minute (scenario seconds).
pub const UNTRACKED_BASE: u64 = 11 * GIB;
pub const UNTRACKED_RATE: u64 = 400 * MIB;
pub const UNTRACKED_RAMP: u64 = 60;

/// The fake NVML's scenario for one daemon: `base` with this test process listed on its last
/// GPU (`gpu_uuid`), its memory growing as `UNTRACKED_*` say.
pub fn with_untracked(base: &str) -> String {
    format!(
        "{base}\n[[gpu.process]]\npid = {}\nname = \"python\"\nused = {{ points = [[0, {UNTRACKED_BASE}], [{UNTRACKED_RAMP}, {}]] }}\n",
        std::process::id(),
        UNTRACKED_BASE + UNTRACKED_RATE * UNTRACKED_RAMP
    )
}

/// A trainer whose allocator is flat while NVML's figure for its process grows: memory outside
/// PyTorch's allocator. Steps are sent as they happen (100 a second), so the daemon pairs each
/// with the figure it polled then; `nvml_t0` is the fake NVML's time 0.
pub fn untracked(d: &Daemon, gpu_uuid: &str, nvml_t0: f64) {
    let hello = Hello {
        job: "outside",
        rank: Some(0),
        gpu_uuid: gpu_uuid.into(),
        ..Hello::default()
    };
    let mut t = Trainer::connect(&d.socket, &hello, 11);
    let at = |step: u64| {
        let grown =
            ((now() - nvml_t0).clamp(0.0, UNTRACKED_RAMP as f64) * UNTRACKED_RATE as f64) as u64;
        Step {
            allocated: 8 * GIB + (step * 7919 % 97) * MIB,
            peak: 9 * GIB,
            reserved: 10 * GIB,
            retries: 0,
            device_free: TOTAL - UNTRACKED_BASE - grown,
        }
    };
    let mut step = 1;
    while firing(d, "outside", "untracked_growth").is_none() {
        assert!(step < 3_000, "no untracked_growth after {step} steps");
        t.steps(step, step + 9, 0.01, at, none);
        step += 10;
        std::thread::sleep(Duration::from_millis(100));
    }
    t.bye();
}
