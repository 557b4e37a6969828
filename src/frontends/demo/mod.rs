//! `gpumon demo`: everything at once on a machine with no GPU. A daemon polls a simulated node
//! (two H100s through the fake NVML library, the real nvml-wrapper path) while three simulated
//! trainers, real child processes, push over the real socket: one healthy, one leaking (flagged
//! after about 70 s, then named down to its line when the daemon asks it, and out of memory about
//! 16 minutes in, the OOM explained as the client explains it: oom.rs), one near the limit with
//! rising retries that says where its memory goes (a batch of 14 would fit; profile.rs), and one
//! watching its memory outside the allocator grow. Beside them a job, `demo-ddp`, of four ranks
//! whose rank 2 runs out of memory 75 s in and takes the other three down with it (job.rs). The
//! simulated NVML lists those children's pids with the memory they report, and memory of one
//! more that has exited, a zombie its launcher never reaps (orphan.rs).

pub mod attribution;
pub mod bundled;
pub mod job;
pub mod oom;
pub mod orphan;
pub mod profile;
pub mod scenario;
pub mod trainer;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};

use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use profile::Profile;

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Print the HTTP URL and socket path, then run until stopped (no TUI).
    #[arg(long)]
    pub headless: bool,
    /// HTTP listen address (default: the config's, or a free port when that is taken).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Ingest socket path (default: in a temporary directory).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The fake NVML library (default: beside the gpumon binary, then ../lib/gpumon/ and
    /// /usr/lib/gpumon/, then the copy built into gpumon).
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Start the simulation this many seconds in. The leaking trainer runs out of memory every
    /// 758 s; its leak is flagged about 70 s into a session, so `--skip 670` shows the leak, its
    /// attribution and then the OOM and the restart within 90 s. The job's rank 2 runs out of
    /// memory 75 s in (`--skip 60`: 15 s after the start); skipped past that, there is no job.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
    pub skip: f64,
    /// Record each simulated trainer's session as a trace file here, for `gpumon analyze`
    /// (a relative path is taken from the current directory, as the daemon's --record-dir).
    #[arg(long, value_name = "DIR")]
    pub record_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct TrainerArgs {
    /// A single trainer (or --rank).
    #[arg(long, value_enum, required_unless_present = "rank")]
    pub profile: Option<Profile>,
    /// A rank of the demo's job instead (with --run-id).
    #[arg(long, conflicts_with = "profile", requires = "run_id")]
    pub rank: Option<u64>,
    #[arg(long)]
    pub run_id: Option<String>,
    #[arg(long)]
    pub socket: PathBuf,
    #[arg(long)]
    pub gpu_uuid: String,
    /// Unix time the demo started: the clock shared with the simulated NVML.
    #[arg(long)]
    pub t0: f64,
}

/// What the demo takes from the config: each used unless its flag says otherwise.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub listen: SocketAddr,
    pub record_dir: Option<PathBuf>,
}

/// What the demo hands the daemon it runs: the bound listeners, the simulated node's NVML
/// library and where to record.
pub struct DaemonParts {
    pub listener: TcpListener,
    pub ingest: UnixListener,
    pub socket: PathBuf,
    pub nvml_lib: String,
    pub record_dir: Option<PathBuf>,
    pub shutdown: CancellationToken,
}

/// Starts the daemon on the demo's parts; called inside the demo's runtime, it returns the
/// daemon's run for the demo to spawn. Given by the caller, which holds the config: the daemon
/// wires every layer and sits above the frontends.
pub type DaemonFn = Box<dyn FnOnce(DaemonParts) -> anyhow::Result<DaemonRun> + Send>;
pub type DaemonRun = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// Children and the scratch directory, cleaned up however the demo ends.
struct Node {
    dir: PathBuf,
    socket: PathBuf,
    children: Vec<Child>,
}

impl Drop for Node {
    fn drop(&mut self) {
        for c in &mut self.children {
            // SIGTERM first so a child can finish its line; then reap it.
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(c),
                rustix::process::Signal::TERM,
            );
            let _ = c.wait();
        }
        // The socket may live outside the scratch directory (--socket).
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The fake NVML library (see bundled.rs for where it is looked for); `dir` is the demo's scratch
/// directory, used only where the built-in copy cannot be loaded from memory.
fn fake_lib(args: &DemoArgs, dir: &Path) -> anyhow::Result<bundled::FakeLib> {
    let lib = bundled::find(args.nvml_lib.as_deref(), dir)?;
    tracing::info!(path = %lib.path.display(), origin = lib.origin, "fake NVML library");
    Ok(lib)
}

pub fn run(
    args: DemoArgs,
    defaults: Defaults,
    daemon: DaemonFn,
    tui: Option<TuiFn>,
) -> anyhow::Result<()> {
    if !(args.skip.is_finite() && args.skip >= 0.0) {
        anyhow::bail!("--skip takes seconds, 0 or more (got {})", args.skip);
    }
    let dir = std::env::temp_dir().join(format!("gpumon-demo-{}", std::process::id()));
    // Held until the demo returns: NVML may open the library again at any time.
    let lib = fake_lib(&args, &dir)?;
    std::fs::create_dir_all(&dir)?;
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| dir.join("ingest.sock"));
    let mut node = Node {
        dir: dir.clone(),
        socket: socket.clone(),
        children: Vec::new(),
    };
    // Trainers and the simulated NVML share this clock; skipping moves its start back.
    let t0 = crate::core::model::now() - args.skip;
    let exe = std::env::current_exe()?;
    let trainer = |what: &[&str], gpu: usize| {
        Command::new(&exe)
            .arg("demo-trainer")
            .args(what)
            .arg("--gpu-uuid")
            .arg(scenario::UUIDS[gpu])
            .arg("--socket")
            .arg(&socket)
            .arg("--t0")
            .arg(t0.to_string())
            .stdin(Stdio::null())
            .spawn()
    };
    let mut pids = Vec::new();
    for p in profile::ALL {
        let child = trainer(&["--profile", profile_name(p)], p.gpu())?;
        pids.push((p, child.id()));
        node.children.push(child);
    }
    let mut ranks = Vec::new();
    if job::launched(args.skip) {
        let run_id = job::run_id(t0);
        for rank in 0..job::WORLD_SIZE {
            let r = rank.to_string();
            let child = trainer(&["--rank", &r, "--run-id", &run_id], job::GPU)?;
            ranks.push((rank, child.id()));
            node.children.push(child);
        }
    }
    let mut node_toml = scenario::toml(&pids, &ranks);
    let orphaned = orphan::start(args.skip, &dir).map(|(launcher, pid)| {
        node.children.push(launcher);
        node_toml += &orphan::toml(pid);
        pid
    });
    let scen = dir.join("node.toml");
    std::fs::write(&scen, node_toml)?;
    // Read by the fake library at NVML init, which happens after this on the poller thread.
    std::env::set_var("FAKE_NVML_SCENARIO", &scen);
    std::env::set_var("FAKE_NVML_T0", t0.to_string());
    let record_dir = match &args.record_dir {
        // Relative is refused by the recorder; made absolute here, as a user means it.
        Some(d) => Some(std::path::absolute(d)?),
        None => defaults.record_dir,
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = bind_http(args.listen.unwrap_or(defaults.listen), args.listen.is_some()).await?;
        let addr = listener.local_addr()?;
        let ingest = crate::sources::ingest::socket::bind(&socket)?;
        // Removed again when the demo exits, like the daemon's.
        let _socket_file = crate::sources::ingest::socket::SocketFile::claim(&socket);
        let mut banner = format!(
            "gpumon demo: http://{addr}  (metrics: http://{addr}/metrics, API: http://{addr}/api/v1/snapshot)\n\
             socket: {}\n\
             simulated node: 2 x H100 80GB; trainers: healthy (GPU 0), leak (GPU 0), untracked (GPU 0), near-limit (GPU 1)\n",
            socket.display()
        );
        if !ranks.is_empty() {
            banner += &format!(
                "job: {} of {} ranks (GPU 0); rank {} runs out of memory {:.0} s in\n",
                job::JOB,
                job::WORLD_SIZE,
                job::FAILING_RANK,
                job::FAIL_AT
            );
        }
        if let Some(pid) = orphaned {
            banner += &orphan::banner(pid);
        }
        if let Some(d) = &record_dir {
            banner += &format!(
                "traces: {} (replay with `gpumon analyze {}/gpumon-*.trace.jsonl`)\n",
                d.display(),
                d.display()
            );
        }
        // One write, and a closed stdout (`gpumon demo --headless | head -1`) is not fatal:
        // println! would panic on the broken pipe and take the running demo down with it.
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
        }
        let shutdown = CancellationToken::new();
        let daemon = tokio::spawn(daemon(DaemonParts {
            listener,
            ingest,
            socket: socket.clone(),
            nvml_lib: lib.path.display().to_string(),
            record_dir,
            shutdown: shutdown.clone(),
        })?);
        // Without a terminal (a pipe, a service) the demo runs headless rather than failing.
        let interactive = !args.headless && std::io::IsTerminal::is_terminal(&std::io::stdout());
        if let Some(tui) = tui.filter(|_| interactive) {
            let url = format!("http://{addr}");
            let stop = shutdown.clone();
            tokio::task::spawn_blocking(move || {
                let r = tui(url);
                stop.cancel();
                r
            })
            .await??;
        }
        daemon.await?
    })?;
    drop(node);
    Ok(())
}

/// Runs the TUI against a daemon URL until the user quits.
pub type TuiFn = Box<dyn FnOnce(String) -> anyhow::Result<()> + Send>;

async fn bind_http(addr: SocketAddr, explicit: bool) -> anyhow::Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => Ok(l),
        // The default port is often taken by a real daemon: a demo just takes another.
        Err(e) if !explicit && e.kind() == std::io::ErrorKind::AddrInUse => {
            Ok(tokio::net::TcpListener::bind(SocketAddr::new(addr.ip(), 0)).await?)
        }
        Err(e) => Err(anyhow::anyhow!(
            "cannot listen on {addr}: {e}; pick another --listen address"
        )),
    }
}

fn profile_name(p: Profile) -> &'static str {
    match p {
        Profile::Healthy => "healthy",
        Profile::Leak => "leak",
        Profile::NearLimit => "near-limit",
        Profile::Untracked => "untracked",
    }
}

pub fn run_trainer(a: &TrainerArgs) -> anyhow::Result<()> {
    let socket = Path::new(&a.socket);
    match (a.profile, a.rank, &a.run_id) {
        (Some(p), _, _) => trainer::run(p, socket, &a.gpu_uuid, a.t0),
        (None, Some(rank), Some(run_id)) => job::rank::run(rank, run_id, socket, &a.gpu_uuid, a.t0),
        _ => anyhow::bail!("--profile, or --rank with --run-id"),
    }
}
