//! gpumon-loadgen: drives a running gpumon daemon's ingest socket with many simulated trainers
//! and reports what the daemon accepted (from its own counters), how long a sample takes to
//! show in the API, and the daemon's memory and CPU.

mod daemon;
mod lines;
mod probe;
mod report;
mod stats;
mod trainer;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;

use daemon::Api;
use lines::Identity;
use report::Report;
use stats::{Mode, Source};
use trainer::Trainer;

/// Sessions opened by the load generator carry this job label.
const JOB: &str = "gpumon-loadgen";

#[derive(Debug, Parser)]
#[command(name = "gpumon-loadgen", version, about)]
pub struct Args {
    /// The daemon's ingest socket.
    #[arg(long, env = "GPUMON_SOCKET", value_name = "PATH")]
    socket: PathBuf,
    /// The daemon's HTTP base URL.
    #[arg(long, default_value = "http://127.0.0.1:9477", value_name = "URL")]
    api: String,
    /// Concurrent trainer connections pushing samples (a probe connection comes on top).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Seconds of load before measuring starts.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Samples per second offered across all connections; 0 sends as fast as the daemon reads.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Sample lines per write(2) on each connection.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Samples each connection sends first, one second apart and ending now (3600: an hour at
    /// 1 Hz), before the daemon's memory is read; 0 skips this.
    #[arg(long, default_value_t = 3600)]
    history: u64,
    /// What the samples' figures do: `simple` keeps all but allocated memory fixed (cheap to
    /// make, for throughput); `realistic` moves every figure as a training run's allocator does
    /// (varying batches, noise, segments, retries), for measuring the daemon's memory honestly.
    #[arg(long, value_enum, default_value_t = Mode::Simple)]
    stats: Mode,
    /// Group the connections into jobs of this many ranks, as torchrun's ranks are: each job's
    /// sessions say ranks 0 to N-1, `world_size` N and one `run_id` (`--run-id` with the job's
    /// number after it), so 64 connections with 8 make 8 jobs of 8 ranks. 0 (the default): every
    /// session says rank = its number, world_size 64 and no run_id, as before.
    #[arg(long, default_value_t = 0, value_name = "N")]
    ranks_per_job: usize,
    /// The jobs' run_id, before `-<job number>` (with --ranks-per-job); by default
    /// `gpumon-loadgen-<pid>`, a new run each time the load generator starts.
    #[arg(long, value_name = "ID")]
    run_id: Option<String>,
    /// Seed of the realistic figures: the same seed sends the same figures.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Time between latency probes, in milliseconds; 0 runs no probe (load and CPU only).
    #[arg(long, default_value_t = 10)]
    probe_interval_ms: u64,
    /// The daemon's pid, for RSS and CPU; by default learnt from the socket (SO_PEERCRED).
    #[arg(long)]
    daemon_pid: Option<u32>,
    /// Fail (exit 1) when fewer samples/s are accepted.
    #[arg(long, value_name = "SAMPLES_PER_S")]
    min_rate: Option<f64>,
    /// Fail when the p99 push-to-API latency is higher.
    #[arg(long, value_name = "MS")]
    max_p99_ms: Option<f64>,
    /// Fail when the daemon's RSS (with the history loaded, and after the run) is higher.
    #[arg(long, value_name = "MB")]
    max_rss_mb: Option<f64>,
    /// Fail when the daemon used more CPU than this over the measured seconds, in cores.
    #[arg(long, value_name = "CORES")]
    max_cpu_cores: Option<f64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(report) => {
            print!("{report}");
            let failures = report.failures(&args);
            for f in &failures {
                println!("FAIL: {f}");
            }
            if failures.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("gpumon-loadgen: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> anyhow::Result<Report> {
    if args.connections == 0 || args.batch == 0 || args.seconds == 0 {
        bail!("--connections, --batch and --seconds must be at least 1");
    }
    if args.ranks_per_job > 0 && !args.connections.is_multiple_of(args.ranks_per_job) {
        bail!(
            "--connections {} is not a whole number of jobs of --ranks-per-job {}",
            args.connections,
            args.ranks_per_job
        );
    }
    let run_id = args
        .run_id
        .clone()
        .unwrap_or_else(|| format!("{JOB}-{}", std::process::id()));
    // The daemon takes a run_id of up to 128 bytes; the job's number goes after it.
    if run_id.len() > 100 {
        bail!("--run-id is longer than 100 bytes");
    }
    let api = Api::new(&args.api);
    let start_counters = api.counters()?;
    // The probe needs a new step in each sample, which simple figures always give.
    let mut probe = Trainer::connect(
        &args.socket,
        &format!("{JOB}-probe"),
        0,
        &Identity::of(0, 0, ""),
        Source::new(Mode::Simple, args.seed, 0),
    )?;
    let pid = match args.daemon_pid {
        Some(p) => p,
        None => daemon::peer_pid(&probe.stream)?,
    };
    let mut trainers = (0..args.connections)
        .map(|i| {
            let source = Source::new(args.stats, args.seed, i as u64);
            let id = Identity::of(i, args.ranks_per_job, &run_id);
            Trainer::connect(&args.socket, JOB, i, &id, source)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut r = Report::new(args, pid);

    if args.history > 0 {
        let batch = args.batch;
        std::thread::scope(|s| {
            let jobs: Vec<_> = trainers
                .iter_mut()
                .map(|t| s.spawn(move || t.history(args.history, batch)))
                .collect();
            jobs.into_iter()
                .try_for_each(|j| j.join().unwrap_or(Ok(())))
        })
        .context("sending history")?;
        // Every hello and every history sample accepted: the rings are as full as asked.
        let want =
            start_counters.lines + 1.0 + (args.connections as f64) * (args.history as f64 + 1.0);
        wait_for_lines(&api, want, start_counters.rejected)?;
        std::thread::sleep(Duration::from_millis(500));
        r.history_rss = Some(daemon::memory(pid)?.0);
    }

    let stop_load = AtomicBool::new(false);
    let stop_probe = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let per_conn = args.rate as f64 / args.connections as f64;
    let interval = Duration::from_millis(args.probe_interval_ms);
    let mut closed = Vec::new();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let writers: Vec<_> = trainers
            .iter_mut()
            .map(|t| {
                let (stop, sent) = (&stop_load, &sent);
                s.spawn(move || t.run(per_conn, args.batch, stop, sent))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(args.warmup));
        let (c0, cpu0, sent0, own0) = (
            api.counters()?,
            daemon::cpu(pid)?,
            sent.load(Ordering::Relaxed),
            daemon::cpu(std::process::id())?,
        );
        let t0 = Instant::now();
        let load0 = daemon::load_average();
        let prober = (!interval.is_zero())
            .then(|| s.spawn(|| probe::run(&mut probe, &api, interval, &stop_probe)));
        std::thread::sleep(Duration::from_secs(args.seconds));
        let (c1, cpu1, sent1, own1) = (
            api.counters()?,
            daemon::cpu(pid)?,
            sent.load(Ordering::Relaxed),
            daemon::cpu(std::process::id())?,
        );
        let secs = t0.elapsed().as_secs_f64();
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        r.machine = (cpus, load0, daemon::load_average());
        stop_probe.store(true, Ordering::Relaxed);
        let latencies = match prober {
            Some(p) => Some(
                p.join()
                    .map_err(|_| anyhow::anyhow!("the probe thread panicked"))??,
            ),
            None => None,
        };
        stop_load.store(true, Ordering::Relaxed);
        for w in writers {
            if let Ok(Err(e)) = w.join() {
                closed.push(e);
            }
        }
        r.measured(secs, c0, c1, (sent1 - sent0) as f64, latencies);
        r.daemon_cpu = (cpu1 - cpu0).as_secs_f64() / secs;
        r.own_cpu = (own1 - own0).as_secs_f64() / secs;
        Ok(())
    })?;
    r.closed = closed;

    // The load has stopped but every session is still open: the steady state to size, after
    // the daemon has also served a full snapshot of them all.
    r.live = live_sessions(&api)?;
    std::thread::sleep(Duration::from_secs(1));
    r.after_rss = Some(daemon::memory(pid)?);
    for t in &trainers {
        t.bye();
    }
    probe.bye();
    Ok(r)
}

fn wait_for_lines(api: &Api, want: f64, rejected_before: f64) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let c = api.counters()?;
        if c.lines >= want {
            return Ok(());
        }
        if c.rejected > rejected_before || start.elapsed() > Duration::from_secs(120) {
            bail!(
                "the daemon accepted {} of {want} lines ({} rejected); see its log",
                c.lines,
                c.rejected - rejected_before
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How many load-generator sessions are live, and the fewest samples any of them took.
fn live_sessions(api: &Api) -> anyhow::Result<(usize, u64)> {
    let snap = api.json("/api/v1/snapshot")?;
    let samples: Vec<u64> = snap["sessions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["job"] == JOB && s["ended"].is_null())
                .filter_map(|s| s["samples"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    Ok((samples.len(), samples.iter().copied().min().unwrap_or(0)))
}
