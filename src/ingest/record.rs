//! `--record-dir`: each session's accepted lines, as received, in a trace file of its own (hello
//! first), so `gpumon analyze` can replay it later. A file past `max_file_bytes` is closed and a
//! new part begins with the hello again (every part is a valid trace); the directory is kept under
//! `max_total_bytes` by deleting the oldest finished traces first.
//!
//! Writes go through a 64 KiB buffer to the page cache from the connection's task: a few
//! microseconds per flush, which is cheaper than a hand-off to another thread per line.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub struct Recorder {
    dir: PathBuf,
    max_file_bytes: u64,
    max_total_bytes: u64,
    /// Files being written, which pruning must not delete.
    open: Mutex<HashSet<PathBuf>>,
}

/// One session's trace being written.
pub struct Trace {
    rec: Arc<Recorder>,
    base: String,
    hello: Vec<u8>,
    part: u32,
    path: PathBuf,
    file: Option<BufWriter<File>>,
    written: u64,
}

impl Recorder {
    /// Checks that `dir` exists (creating it) and is writable, so a bad path fails at start-up.
    pub fn new(
        dir: &Path,
        max_file_bytes: u64,
        max_total_bytes: u64,
    ) -> std::io::Result<Arc<Self>> {
        std::fs::create_dir_all(dir)?;
        let probe = dir.join(".gpumon-write-test");
        File::create(&probe)?;
        let _ = std::fs::remove_file(&probe);
        Ok(Arc::new(Self {
            dir: dir.to_path_buf(),
            max_file_bytes,
            max_total_bytes,
            open: Mutex::new(HashSet::new()),
        }))
    }

    /// Starts the trace of a session whose hello line was just accepted.
    pub fn start(
        self: &Arc<Self>,
        session: &str,
        job: Option<&str>,
        rank: Option<u64>,
        started: f64,
        hello: &[u8],
    ) -> Trace {
        let job = sanitize(job.unwrap_or("trainer"));
        let rank = rank.map(|r| format!("-r{r}")).unwrap_or_default();
        let mut t = Trace {
            rec: self.clone(),
            base: format!("{}-{session}-{job}{rank}", started as u64),
            hello: hello.to_vec(),
            part: 0,
            path: PathBuf::new(),
            file: None,
            written: 0,
        };
        t.open_part();
        t
    }

    fn lock_open(&self) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
        // A poisoned lock only means another task panicked mid-update of a set of paths; the set
        // itself is still usable.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes the oldest finished traces until `incoming` more bytes fit under the total cap.
    fn prune(&self, open: &HashSet<PathBuf>, incoming: u64) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum::<u64>() + incoming;
        files.sort();
        for (_, len, path) in files {
            if total <= self.max_total_bytes {
                break;
            }
            if open.contains(&path) {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total -= len;
                    tracing::info!(file = %path.display(), "record dir over its size cap: deleted the oldest trace");
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "cannot delete old trace")
                }
            }
        }
    }
}

impl Trace {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one accepted line (without its newline).
    pub fn write(&mut self, line: &[u8]) {
        if self.file.is_some() && self.written + line.len() as u64 + 1 > self.rec.max_file_bytes {
            self.open_part();
        }
        self.append(line);
    }

    fn append(&mut self, line: &[u8]) {
        let Some(f) = self.file.as_mut() else { return };
        if let Err(e) = f.write_all(line).and_then(|()| f.write_all(b"\n")) {
            tracing::warn!(file = %self.path.display(), error = %e, "trace write failed; recording of this session stops");
            self.close_file();
            return;
        }
        self.written += line.len() as u64 + 1;
    }

    /// Closes the current part (if any) and opens the next, which begins with the hello again.
    fn open_part(&mut self) {
        self.close_file();
        let rec = self.rec.clone();
        let mut open = rec.lock_open();
        rec.prune(&open, rec.max_file_bytes.min(rec.max_total_bytes));
        let suffix = if self.part == 0 {
            String::new()
        } else {
            format!(".{}", self.part)
        };
        self.part += 1;
        let mut path = rec.dir.join(format!("{}{suffix}.jsonl", self.base));
        let mut n = 1;
        let file = loop {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => {
                    n += 1;
                    path = rec.dir.join(format!("{}{suffix}-{n}.jsonl", self.base));
                }
                other => break other,
            }
        };
        match file {
            Ok(f) => {
                open.insert(path.clone());
                self.file = Some(BufWriter::with_capacity(64 * 1024, f));
                self.path = path;
                self.written = 0;
                drop(open);
                let hello = std::mem::take(&mut self.hello);
                self.append(&hello);
                self.hello = hello;
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot create trace file; this session is not recorded")
            }
        }
    }

    fn close_file(&mut self) {
        if let Some(mut f) = self.file.take() {
            if let Err(e) = f.flush() {
                tracing::warn!(file = %self.path.display(), error = %e, "trace flush failed");
            }
            self.rec.lock_open().remove(&self.path);
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        self.close_file();
    }
}

/// Job names come from clients: keep file names to a safe alphabet and length.
fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    match out.trim_start_matches('.') {
        "" => "trainer".into(),
        s => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(p: &Path) -> Vec<String> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    }

    #[test]
    fn a_trace_is_hello_then_lines_and_rotates_with_hello_first() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recorder::new(dir.path(), 100, 10_000).unwrap();
        let hello = br#"{"type":"hello","v":1}"#;
        let mut t = rec.start("s-1", Some("llama/ft x"), Some(3), 1763700000.5, hello);
        let first = t.path().to_path_buf();
        assert_eq!(
            first.file_name().unwrap().to_str().unwrap(),
            "1763700000-s-1-llama_ft_x-r3.jsonl"
        );
        for i in 0..10 {
            t.write(format!(r#"{{"type":"sample","step":{i}}}"#).as_bytes());
        }
        drop(t);
        let parts: Vec<PathBuf> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(parts.len() >= 3, "{parts:?}");
        let mut samples = Vec::new();
        for p in &parts {
            assert!(
                std::fs::metadata(p).unwrap().len() <= 100,
                "{p:?} over the cap"
            );
            let l = lines(p);
            assert_eq!(l[0], r#"{"type":"hello","v":1}"#, "{p:?} starts with hello");
            samples.extend(l[1..].iter().cloned());
        }
        // Every sample is in exactly one part.
        samples.sort();
        let mut want: Vec<String> = (0..10)
            .map(|i| format!(r#"{{"type":"sample","step":{i}}}"#))
            .collect();
        want.sort();
        assert_eq!(samples, want);
    }

    #[test]
    fn the_directory_stays_under_its_cap_deleting_the_oldest_finished_traces() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recorder::new(dir.path(), 1_000, 3_000).unwrap();
        let line = [b'x'; 99];
        let keep = rec.start("s-0", None, None, 1.0, b"{}");
        for s in 1..20 {
            let mut t = rec.start(&format!("s-{s}"), None, None, s as f64 + 1.0, b"{}");
            for _ in 0..9 {
                t.write(&line);
            }
        }
        let total: u64 = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(total <= 3_000, "record dir holds {total} bytes");
        assert!(keep.path().exists(), "an open trace is never deleted");
        assert!(dir.path().join("20-s-19-trainer.jsonl").exists());
    }

    #[test]
    fn an_unwritable_directory_is_refused_at_start() {
        assert!(Recorder::new(Path::new("/proc/gpumon-no-such-dir"), 1, 1).is_err());
    }
}
