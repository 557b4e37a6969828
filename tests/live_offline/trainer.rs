//! A trainer as the daemon meets it: raw protocol lines over the real Unix socket, each line
//! stamped near the daemon's clock (a sample more than an hour old would be clamped live and not
//! offline, a difference the replay is right to keep).
#![allow(dead_code)]

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TOTAL: u64 = 85_520_809_984;

pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Who the trainer says it is.
#[derive(Clone, Default)]
pub struct Hello {
    pub job: &'static str,
    pub run_id: Option<&'static str>,
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub gpu_uuid: String,
    /// Extra fields, each `"key":value`.
    pub extra: Vec<String>,
}

impl Hello {
    pub fn line(&self, pid: u32) -> String {
        let mut s = format!(
            r#"{{"type":"hello","v":1,"pid":{pid},"job":"{}","gpu_uuid":"{}""#,
            self.job, self.gpu_uuid
        );
        if let Some(r) = self.run_id {
            let _ = write!(s, r#","run_id":"{r}""#);
        }
        if let Some(r) = self.rank {
            let _ = write!(s, r#","rank":{r}"#);
        }
        if let Some(w) = self.world_size {
            let _ = write!(s, r#","world_size":{w}"#);
        }
        for e in &self.extra {
            s.push(',');
            s.push_str(e);
        }
        s.push('}');
        s
    }
}

/// One step's figures.
#[derive(Clone, Copy, Default)]
pub struct Step {
    pub allocated: u64,
    pub peak: u64,
    pub reserved: u64,
    pub retries: u64,
    pub device_free: u64,
}

pub struct Trainer {
    w: UnixStream,
    r: BufReader<UnixStream>,
    /// The newest line's time: samples sent later never go back before it.
    last_ts: f64,
    /// The last `seq` given (capability `ack`), when lines are numbered.
    seq: Option<u64>,
}

impl Trainer {
    pub fn connect(socket: &Path, hello: &Hello, pid: u32) -> Self {
        let w = UnixStream::connect(socket).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let r = BufReader::new(w.try_clone().unwrap());
        let mut t = Self {
            w,
            r,
            last_ts: 0.0,
            seq: None,
        };
        t.send(&hello.line(pid));
        let welcome = t.read();
        assert_eq!(welcome["type"], "welcome", "{welcome}");
        t
    }

    /// Numbers every line from now on (capability `ack`), after `last` (the same `instance`
    /// numbers on across connections), and never sends a line before `after` in time.
    pub fn numbered(mut self, last: u64, after: f64) -> Self {
        self.seq = Some(last);
        self.last_ts = self.last_ts.max(after);
        self
    }

    /// The last `seq` given and the newest line's time, for the next connection.
    pub fn position(&self) -> (u64, f64) {
        (self.seq.unwrap_or(0), self.last_ts)
    }

    /// `,"seq":N` for the next numbered line, or nothing.
    fn seq(&mut self) -> String {
        match &mut self.seq {
            Some(n) => {
                *n += 1;
                format!(r#","seq":{n}"#)
            }
            None => String::new(),
        }
    }

    pub fn send(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).unwrap();
        self.w.write_all(b"\n").unwrap();
    }

    pub fn send_all(&mut self, lines: &str) {
        self.w.write_all(lines.as_bytes()).unwrap();
    }

    /// The daemon's next line to this trainer.
    pub fn read(&mut self) -> serde_json::Value {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// Samples of steps `from..=to`, `dt` seconds apart, the last one `dt` before now; `extra`
    /// may add fields to a step's sample (`,"categories":{...}`).
    pub fn steps(
        &mut self,
        from: u64,
        to: u64,
        dt: f64,
        at: impl Fn(u64) -> Step,
        extra: impl Fn(u64) -> String,
    ) {
        let t0 = (now() - (to - from + 1) as f64 * dt).max(self.last_ts + dt);
        self.last_ts = t0 + (to - from) as f64 * dt;
        // No sample comes from the future: a trainer sends a step once it is done.
        let ahead = self.last_ts - now();
        if ahead > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(ahead));
        }
        let mut out = String::new();
        for step in from..=to {
            let s = at(step);
            let seq = self.seq();
            let _ = writeln!(
                out,
                r#"{{"type":"sample","ts":{:.3},"step":{step},"stats":{{"allocated_bytes.all.current":{},"allocated_bytes.all.peak":{},"reserved_bytes.all.current":{},"num_alloc_retries":{},"num_ooms":0}},"device_free":{},"device_total":{TOTAL}{}{seq}}}"#,
                t0 + (step - from) as f64 * dt,
                s.allocated,
                s.peak,
                s.reserved,
                s.retries,
                s.device_free,
                extra(step),
            );
            // In pieces, as a trainer sends them: the daemon applies many batches.
            if out.len() > 64 * 1024 {
                self.send_all(&out);
                out.clear();
            }
        }
        self.send_all(&out);
    }

    /// A line's time: now, or just after the newest line sent.
    pub fn ts(&mut self) -> f64 {
        self.last_ts = now().max(self.last_ts + 0.001);
        self.last_ts
    }

    pub fn oom(&mut self, alloc: u64, free: u64, extra: &str) {
        let ts = self.ts();
        let seq = self.seq();
        self.send(&format!(
            r#"{{"type":"event","ts":{ts:.3},"kind":"oom","alloc_bytes":{alloc},"device_free":{free},"detail":"CUDA out of memory. Tried to allocate {} MiB"{extra}{seq}}}"#,
            alloc / MIB
        ));
    }

    /// The client's signal handler: the trainer is being stopped.
    pub fn signalled(&mut self, signal: &str) {
        let ts = self.ts();
        let seq = self.seq();
        self.send(&format!(
            r#"{{"type":"event","ts":{ts:.3},"kind":"mark","detail":"trainer got {signal}","ending":"signal","signal":"{signal}"{seq}}}"#
        ));
    }

    /// A clean end: bye, then the daemon's close.
    pub fn bye(mut self) {
        let ts = self.ts();
        let seq = self.seq();
        self.send(&format!(r#"{{"type":"bye","ts":{ts:.3}{seq}}}"#));
        self.w.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = String::new();
        while self.r.read_line(&mut rest).unwrap_or(0) > 0 {}
    }

    /// Gone without bye: the connection drops, as when the process dies.
    pub fn die(self) {
        drop(self);
    }
}
