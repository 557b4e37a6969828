//! One simulated trainer: a connection that says hello, then pushes samples.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::lines::{self, Identity};
use crate::stats::Source;

pub struct Trainer {
    pub stream: UnixStream,
    /// The session id from the daemon's welcome.
    pub session: String,
    step: u64,
    source: Source,
    buf: Vec<u8>,
}

impl Trainer {
    /// Connects and says hello as session `index` of the load, `id` in job `job`; fails unless
    /// the daemon answers with a welcome. Samples' figures come from `source`.
    pub fn connect(
        socket: &Path,
        job: &str,
        index: usize,
        id: &Identity,
        source: Source,
    ) -> anyhow::Result<Self> {
        let stream = UnixStream::connect(socket).with_context(|| {
            format!(
                "cannot connect to the ingest socket {}; is the daemon running with --socket {}?",
                socket.display(),
                socket.display()
            )
        })?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        (&stream).write_all(lines::hello(job, index, id).as_bytes())?;
        let mut reply = String::new();
        BufReader::new(&stream)
            .read_line(&mut reply)
            .context("no reply to hello")?;
        let v: serde_json::Value = serde_json::from_str(&reply)
            .with_context(|| format!("reply to hello is not JSON: {reply:?}"))?;
        if v["type"] != "welcome" {
            bail!("the daemon refused hello: {}", reply.trim());
        }
        let session = v["session"].as_str().unwrap_or_default().to_string();
        Ok(Self {
            stream,
            session,
            step: 0,
            source,
            buf: Vec::with_capacity(64 * 1024),
        })
    }

    /// Sends `n` samples one second apart (give or take the source's jitter), ending now: `n` =
    /// 3600 is an hour of 1 Hz history.
    pub fn history(&mut self, n: u64, batch: usize) -> std::io::Result<()> {
        let end = lines::now();
        let mut left = n;
        while left > 0 {
            self.buf.clear();
            for _ in 0..left.min(batch as u64) {
                left -= 1;
                let s = self.next();
                // The newest is not sent from the future.
                let jitter = if left == 0 {
                    s.jitter.min(0.0)
                } else {
                    s.jitter
                };
                lines::sample(&mut self.buf, end - left as f64 + jitter, &s);
            }
            (&self.stream).write_all(&self.buf)?;
        }
        Ok(())
    }

    /// One sample now; returns its step (a new one for the simple source the probe uses).
    pub fn one(&mut self) -> std::io::Result<u64> {
        self.buf.clear();
        let s = self.next();
        lines::sample(&mut self.buf, lines::now(), &s);
        (&self.stream).write_all(&self.buf)?;
        Ok(self.step)
    }

    fn next(&mut self) -> crate::stats::Sample {
        let s = self.source.next(self.step);
        self.step = s.step;
        s
    }

    /// Sends samples stamped with the wall clock until `stop`, `batch` lines per write, at `rate`
    /// lines/s (0: as fast as the socket takes them). Counts lines into `sent`. On a write error,
    /// returns the daemon's last reply, which names the limit when it closed the connection.
    pub fn run(
        &mut self,
        rate: f64,
        batch: usize,
        stop: &AtomicBool,
        sent: &AtomicU64,
    ) -> Result<(), String> {
        let start = Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if rate > 0.0 {
                let due = start + Duration::from_secs_f64(n as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            self.buf.clear();
            let ts = lines::now();
            for _ in 0..batch {
                let s = self.next();
                lines::sample(&mut self.buf, ts, &s);
            }
            if let Err(e) = (&self.stream).write_all(&self.buf) {
                return Err(format!("{e}; daemon said: {}", self.last_reply()));
            }
            n += batch as u64;
            sent.fetch_add(batch as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn last_reply(&self) -> String {
        let _ = self.stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut last = String::from("nothing");
        let mut line = String::new();
        let mut r = BufReader::new(&self.stream);
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            last = std::mem::take(&mut line).trim().to_string();
        }
        last
    }

    /// Ends the session cleanly.
    pub fn bye(&self) {
        let line = format!("{{\"type\":\"bye\",\"ts\":{:.3}}}\n", lines::now());
        let _ = (&self.stream).write_all(line.as_bytes());
    }
}
