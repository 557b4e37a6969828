//! The demo's orphaned memory: a `python` process whose launcher, `torchrun`, never reaps it.
//! It exits half a second in and stays a real zombie, and the simulated NVML lists its pid on
//! GPU 1 with a CUDA context's worth of memory (what an unreaped process's context keeps) until
//! `FREED_AT`. The daemon raises orphaned_memory for it a minute in (its grace) naming the
//! launcher to reap it, and resolves it when the memory goes. GPU 1 is the near-limit
//! trainer's: 320 MiB is most of what it has left.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The GPU it holds memory on: the last of the scenario's, where appended lines land.
pub const GPU: usize = 1;
pub const BYTES: u64 = 320 << 20;
/// Seconds after the demo's start when NVML stops listing it (its launcher was dealt with).
pub const FREED_AT: f64 = 600.0;

/// Whether a demo that starts `skip` seconds in shows it: only while NVML would list it.
pub fn shown(skip: f64) -> bool {
    skip < FREED_AT
}

/// `spawn`, for a demo that starts `skip` seconds in: nothing once NVML would list it no more.
pub fn start(skip: f64, dir: &Path) -> Option<(Child, u32)> {
    shown(skip).then(|| spawn(dir)).flatten()
}

/// Starts the launcher and its child in `dir`: the launcher (stopped with the demo's other
/// children) and the pid of the child, which exits half a second later. None, said in the log,
/// where the tools it is made of (`sh`, `sleep`) are not found.
pub fn spawn(dir: &Path) -> Option<(Child, u32)> {
    match try_spawn(dir) {
        Ok(started) => Some(started),
        Err(e) => {
            tracing::warn!(error = %e, "the demo's orphaned memory is left out");
            None
        }
    }
}

fn try_spawn(dir: &Path) -> anyhow::Result<(Child, u32)> {
    // Named by the links they run under: /proc names a process after the file it executed.
    let python = dir.join("python");
    let torchrun = dir.join("torchrun");
    let sleep = tool("sleep")?;
    std::os::unix::fs::symlink(&sleep, &python)?;
    std::os::unix::fs::symlink(&sleep, &torchrun)?;
    let mut cmd = Command::new(tool("sh")?);
    // The shell starts the child, says its pid, and becomes `torchrun`, which waits for no one.
    // The child outlives the shell by a moment: the shell reaps a job that ended before it
    // became `torchrun`.
    cmd.args([
        "-c",
        "\"$0\" 0.5 </dev/null >/dev/null 2>&1 & echo $!; exec \"$1\" 86400",
    ])
    .arg(&python)
    .arg(&torchrun)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe; it outlives the exec, so a demo that
    // is killed does not leave `torchrun` behind (the other children set it themselves).
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
                .map_err(std::io::Error::from)
        });
    }
    let mut launcher = cmd.spawn()?;
    let mut line = String::new();
    if let Some(out) = launcher.stdout.take() {
        BufReader::new(out).read_line(&mut line)?;
    }
    match line.trim().parse() {
        Ok(pid) => Ok((launcher, pid)),
        Err(_) => {
            let _ = launcher.kill();
            let _ = launcher.wait();
            anyhow::bail!("the launcher did not say its child's pid (got {line:?})")
        }
    }
}

/// `name` on PATH (or in /bin, /usr/bin).
fn tool(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow::anyhow!("no {name} on PATH"))
}

/// Its line in the demo's banner.
pub fn banner(pid: u32) -> String {
    format!(
        "orphaned memory: {} MiB on GPU {GPU} held by pid {pid}, a zombie its launcher never reaps (flagged a minute in, freed {FREED_AT:.0} s in)\n",
        BYTES >> 20
    )
}

/// Its lines in the simulated node's scenario, to append (they land on GPU 1, the last).
pub fn toml(pid: u32) -> String {
    format!(
        "\n[[gpu.process]]\npid = {pid}\nname = \"python\"\nused = {BYTES}\nend = {FREED_AT:.3}\n"
    )
}

#[cfg(test)]
mod tests;
