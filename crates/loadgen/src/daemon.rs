//! What the load generator reads about the daemon: its counters over HTTP, and its memory and
//! CPU time from /proc.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

pub struct Api {
    agent: ureq::Agent,
    base: String,
    /// An Authorization header's value, for a daemon asking basic auth.
    auth: Option<String>,
}

impl Api {
    pub fn new(base: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .new_agent();
        Self {
            agent,
            base: base.trim_end_matches('/').to_string(),
            auth: None,
        }
    }

    /// Requests carry this Authorization header value (e.g. `Basic ...`). (gpumon-flood's.)
    #[allow(dead_code)]
    pub fn with_auth(mut self, value: String) -> Self {
        self.auth = Some(value);
        self
    }

    /// (status, body) of a GET on `path`.
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.get(&url);
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        let mut resp = req.call().with_context(|| {
            format!("cannot reach the daemon's API at {url}; is it running? (--api)")
        })?;
        let code = resp.status().as_u16();
        let body = resp.body_mut().read_to_string()?;
        Ok((code, body))
    }

    pub fn json(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let (code, body) = self.get(path)?;
        if code != 200 {
            bail!("GET {path} answered {code}: {}", body.trim());
        }
        serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON"))
    }

    pub fn counters(&self) -> anyhow::Result<Counters> {
        let (code, text) = self.get("/metrics")?;
        if code != 200 {
            bail!("GET /metrics answered {code}");
        }
        Ok(Counters::parse(&text))
    }
}

/// The gpumon_ingest_* counters the report needs.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    pub lines: f64,
    pub rejected: f64,
    pub rate_limited: f64,
    pub connections: f64,
}

impl Counters {
    fn parse(text: &str) -> Self {
        let mut c = Counters::default();
        for line in text.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            if series == "gpumon_ingest_lines_total" {
                c.lines = v;
            } else if series == "gpumon_ingest_connections" {
                c.connections = v;
            } else if series.starts_with("gpumon_ingest_rejected_total{") {
                c.rejected += v;
                if series.contains("\"rate_limited\"") {
                    c.rate_limited = v;
                }
            }
        }
        c
    }
}

/// The pid of the process listening on the other end, from the kernel (SO_PEERCRED).
pub fn peer_pid(s: &UnixStream) -> anyhow::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes given; the fd is open.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 || cred.pid <= 0 {
        bail!(
            "cannot learn the daemon's pid from the socket ({}); pass --daemon-pid",
            std::io::Error::last_os_error()
        );
    }
    Ok(cred.pid as u32)
}

/// Resident and peak resident memory in bytes (VmRSS, VmHWM).
pub fn memory(pid: u32) -> anyhow::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {path}; is --daemon-pid {pid} a live process?"))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .ok_or_else(|| anyhow!("{path} has no {name}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU time (user + system) the process has used so far.
pub fn cpu(pid: u32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // The command name may hold spaces and parentheses: fields are counted after the last ')'.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("{path}: unexpected format"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<u64> {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{path}: field {} missing", i + 3))
    };
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let total = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_millis(total * 1000 / hz))
}

/// The 1-minute load average (0 when /proc/loadavg cannot be read).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_sum_the_rejected_codes() {
        let text = "# HELP x\ngpumon_ingest_lines_total 120\ngpumon_ingest_rejected_total{code=\"bad_json\"} 2\ngpumon_ingest_rejected_total{code=\"rate_limited\"} 3\ngpumon_ingest_connections 4\n";
        let c = Counters::parse(text);
        assert_eq!(c.lines, 120.0);
        assert_eq!(c.rejected, 5.0);
        assert_eq!(c.rate_limited, 3.0);
        assert_eq!(c.connections, 4.0);
    }

    #[test]
    fn own_memory_and_cpu_are_readable() {
        let me = std::process::id();
        let (rss, hwm) = memory(me).unwrap();
        assert!(rss > 0 && hwm >= rss);
        cpu(me).unwrap();
        assert!(memory(u32::MAX).is_err());
    }
}
