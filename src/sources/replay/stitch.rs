//! A run split across traces: when the daemon restarts (or the client reconnects), the client's
//! next connection is a new trace whose first lines name the one it continues (`trace_resumes`,
//! written for the same client `instance`). Given both, `gpumon analyze` replays them as one.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::core::trace::{self, file_name, RecorderLine, MAX_LINE};

/// Lines looked at for the link: the hello, `trace_gpu`, `trace_peer`, `trace_host`,
/// `trace_resumes`, and one to spare.
const HEAD_LINES: usize = 6;

/// What a trace's first lines say of its connection.
#[derive(Debug, Default)]
pub(super) struct Head {
    instance: Option<String>,
    resumes: Option<String>,
    /// The uid the daemon read off the socket (`trace_peer`), and the pid the hello names: the
    /// replayed connection's peer, as the daemon saw it.
    pub uid: Option<u32>,
    pub pid: Option<u32>,
    /// The session id its daemon gave it, as the trace's file name holds it.
    pub session: Option<String>,
}

pub(super) fn head(path: &Path) -> Option<Head> {
    // Opened as analyze opens it: a fifo here would block on the open.
    let mut r = BufReader::new(super::open::open_trace(path).ok()?);
    let mut out = Head::default();
    for k in 0..HEAD_LINES {
        let mut line = Vec::new();
        if (&mut r)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .ok()?
            == 0
        {
            break;
        }
        let line = line.strip_suffix(b"\n").unwrap_or(&line);
        if k == 0 {
            out.instance = trace::hello_instance(line);
            if let Some(h) = hello(line) {
                out.pid = h.pid;
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                out.session = file_name::session_of(name, h.job.as_deref(), h.rank);
            }
            continue;
        }
        match trace::recorder_line(line) {
            Some(RecorderLine::Resumes(f)) => out.resumes = Some(f),
            Some(RecorderLine::Peer(uid)) => out.uid = out.uid.or(Some(uid)),
            _ => {}
        }
    }
    Some(out)
}

/// What of a hello line the head needs: its pid, and the job and rank its file is named by.
struct HelloHead {
    pid: Option<u32>,
    job: Option<String>,
    rank: Option<u64>,
}

/// The hello `line` is, if it is one; each field read alone, so one of a wrong type (refused
/// when the line is replayed) does not hide the others.
fn hello(line: &[u8]) -> Option<HelloHead> {
    if !trace::is_hello(line) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    Some(HelloHead {
        pid: v["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
        job: v["job"].as_str().map(str::to_string),
        rank: v["rank"].as_u64(),
    })
}

/// The files in runs, each in the order written: a file follows the one its `trace_resumes`
/// names when that one is given too (matched by file name) and its hello names the same
/// `instance`. Every other file is a run of its own. Runs keep the order of their first file.
pub(super) fn runs(files: Vec<PathBuf>) -> Vec<Vec<PathBuf>> {
    let heads: Vec<Option<Head>> = files.iter().map(|p| head(p)).collect();
    let by_name: HashMap<&str, usize> = files
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((p.file_name()?.to_str()?, i)))
        .collect();
    // next[i]: the file that continues file i (the first given, if two name it).
    let mut next: Vec<Option<usize>> = vec![None; files.len()];
    let mut follows = vec![false; files.len()];
    for (i, h) in heads.iter().enumerate() {
        let Some(h) = h else { continue };
        let (Some(prev), Some(instance)) = (&h.resumes, &h.instance) else {
            continue;
        };
        let Some(&p) = by_name.get(prev.as_str()) else {
            continue;
        };
        let same = heads[p]
            .as_ref()
            .is_some_and(|ph| ph.instance.as_deref() == Some(instance.as_str()));
        if p != i && same && next[p].is_none() {
            next[p] = Some(i);
            follows[i] = true;
        }
    }
    let mut taken = vec![false; files.len()];
    let mut out = Vec::new();
    for start in 0..files.len() {
        if follows[start] || taken[start] {
            continue;
        }
        let mut run = Vec::new();
        let mut at = Some(start);
        while let Some(i) = at.filter(|i| !taken[*i]) {
            taken[i] = true;
            run.push(files[i].clone());
            at = next[i];
        }
        out.push(run);
    }
    // A loop of links (files renamed into one another) has no start: each is read alone.
    for (i, f) in files.iter().enumerate() {
        if !taken[i] {
            out.push(vec![f.clone()]);
        }
    }
    out
}

#[cfg(test)]
mod tests;
