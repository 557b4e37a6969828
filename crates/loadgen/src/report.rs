//! The figures of one run, printed for people and checked against the --min/--max targets.

use std::fmt;
use std::time::Duration;

use crate::daemon::Counters;
use crate::probe::Latencies;
use crate::Args;

const MIB: f64 = 1024.0 * 1024.0;

pub struct Report {
    connections: usize,
    ranks_per_job: usize,
    batch: usize,
    rate: u64,
    history: u64,
    pid: u32,
    secs: f64,
    /// Lines/s the daemon counted as accepted (gpumon_ingest_lines_total).
    pub accepted: f64,
    pub sent: f64,
    pub rejected: f64,
    pub rate_limited: f64,
    pub latencies: Option<Latencies>,
    /// Cores' worth of CPU over the measured window.
    pub daemon_cpu: f64,
    pub own_cpu: f64,
    /// CPUs online, and the machine's 1-minute load average at the start and end of the window:
    /// latency tails follow what else the machine runs.
    pub machine: (usize, f64, f64),
    pub history_rss: Option<u64>,
    /// (RSS, peak RSS) after the run.
    pub after_rss: Option<(u64, u64)>,
    /// Live load-generator sessions after the run, and the fewest samples one of them took.
    pub live: (usize, u64),
    /// Connections the daemon closed, with what it said.
    pub closed: Vec<String>,
}

impl Report {
    pub fn new(a: &Args, pid: u32) -> Self {
        Self {
            connections: a.connections,
            ranks_per_job: a.ranks_per_job,
            batch: a.batch,
            rate: a.rate,
            history: a.history,
            pid,
            secs: 0.0,
            accepted: 0.0,
            sent: 0.0,
            rejected: 0.0,
            rate_limited: 0.0,
            latencies: None,
            daemon_cpu: 0.0,
            own_cpu: 0.0,
            machine: (0, 0.0, 0.0),
            history_rss: None,
            after_rss: None,
            live: (0, 0),
            closed: Vec::new(),
        }
    }

    pub fn measured(
        &mut self,
        secs: f64,
        c0: Counters,
        c1: Counters,
        sent: f64,
        l: Option<Latencies>,
    ) {
        self.secs = secs;
        self.accepted = (c1.lines - c0.lines) / secs;
        self.sent = sent / secs;
        self.rejected = c1.rejected - c0.rejected;
        self.rate_limited = c1.rate_limited - c0.rate_limited;
        self.latencies = l;
    }

    fn p(&self, pct: f64) -> Option<Duration> {
        self.latencies.as_ref().and_then(|l| l.percentile(pct))
    }

    pub fn failures(&self, a: &Args) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(min) = a.min_rate {
            if self.accepted < min {
                out.push(format!(
                    "accepted {:.0} samples/s < {min:.0}",
                    self.accepted
                ));
            }
        }
        if let Some(max) = a.max_p99_ms {
            match self.p(99.0) {
                Some(p99) if ms(p99) <= max => {}
                Some(p99) => out.push(format!("p99 latency {:.1} ms > {max} ms", ms(p99))),
                None => out.push("no latency probe completed".into()),
            }
            if let Some(l) = self.latencies.as_ref().filter(|l| l.timeouts > 0) {
                out.push(format!("{} probes never showed up", l.timeouts));
            }
        }
        if let Some(max) = a.max_rss_mb {
            let worst = self.history_rss.max(self.after_rss.map(|r| r.0));
            if let Some(rss) = worst.filter(|r| *r as f64 / 1e6 > max) {
                out.push(format!("daemon RSS {:.1} MB > {max} MB", rss as f64 / 1e6));
            }
        }
        if let Some(max) = a.max_cpu_cores.filter(|max| self.daemon_cpu > *max) {
            out.push(format!(
                "daemon CPU {:.2} cores > {max} cores",
                self.daemon_cpu
            ));
        }
        if self.rejected > 0.0 || !self.closed.is_empty() {
            out.push(format!(
                "the daemon rejected {} lines and closed {} connections",
                self.rejected,
                self.closed.len()
            ));
        }
        out
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mem(b: u64) -> String {
    format!("{:.1} MiB ({:.1} MB)", b as f64 / MIB, b as f64 / 1e6)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let offered = match self.rate {
            0 => "as fast as the daemon reads".to_string(),
            r => format!("{r} samples/s offered"),
        };
        let jobs = match self.ranks_per_job {
            0 => String::new(),
            n => format!(" in {} jobs of {n} ranks", self.connections / n),
        };
        writeln!(
            f,
            "gpumon-loadgen: {} connections{jobs} (+1 probe), {} lines per write, {offered}, daemon pid {}",
            self.connections, self.batch, self.pid
        )?;
        if let Some(rss) = self.history_rss {
            writeln!(
                f,
                "history:     {} sessions x {} points loaded; daemon RSS {}",
                self.connections,
                self.history,
                mem(rss)
            )?;
        }
        writeln!(
            f,
            "throughput:  {:.0} samples/s accepted by the daemon over {:.1} s (sent {:.0}/s; rejected {}, of which rate_limited {})",
            self.accepted, self.secs, self.sent, self.rejected, self.rate_limited
        )?;
        if let Some(l) = &self.latencies {
            let show = |p| {
                self.p(p)
                    .map(|d| format!("{:.2} ms", ms(d)))
                    .unwrap_or("-".into())
            };
            writeln!(
                f,
                "latency:     push-to-API p50 {}, p99 {}, max {} over {} probes ({} timed out), polling {}",
                show(50.0),
                show(99.0),
                show(100.0),
                l.samples.len(),
                l.timeouts,
                l.via
            )?;
        }
        let (cpus, load0, load1) = self.machine;
        writeln!(
            f,
            "cpu:         daemon {:.2} cores, load generator {:.2} cores; machine: {cpus} CPUs, load average {load0:.1} -> {load1:.1}",
            self.daemon_cpu, self.own_cpu
        )?;
        if let Some((rss, hwm)) = self.after_rss {
            writeln!(
                f,
                "memory:      daemon RSS {} after the run and a full snapshot (peak {}); {} live sessions, each sent >= {} samples",
                mem(rss),
                mem(hwm),
                self.live.0,
                self.live.1
            )?;
        }
        for c in &self.closed {
            writeln!(f, "closed:      {c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// Each target is checked only when asked for, and a run over it fails naming the figure.
    #[test]
    fn targets_fail_only_when_asked_for_and_exceeded() {
        let args = |extra: &[&str]| {
            let base = ["gpumon-loadgen", "--socket", "/s", "--api", "http://a"];
            Args::parse_from(base.iter().chain(extra))
        };
        let mut r = Report::new(&args(&[]), 1);
        r.daemon_cpu = 0.62;
        r.history_rss = Some(21_000_000);
        assert!(r.failures(&args(&[])).is_empty());
        assert_eq!(
            r.failures(&args(&["--max-cpu-cores", "0.5"])),
            ["daemon CPU 0.62 cores > 0.5 cores"]
        );
        assert!(r.failures(&args(&["--max-cpu-cores", "0.7"])).is_empty());
        assert_eq!(
            r.failures(&args(&["--max-rss-mb", "20"])),
            ["daemon RSS 21.0 MB > 20 MB"]
        );
    }
}
