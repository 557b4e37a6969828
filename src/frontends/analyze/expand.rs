//! What `gpumon analyze` reads: its arguments, a directory standing for its trace files.

use std::path::PathBuf;

use super::Unreadable;

/// The files to read: a directory stands for the trace files in it (`*.jsonl`, by name), as
/// `--record-dir` leaves them.
pub(super) fn expand(paths: &[PathBuf], errors: &mut Vec<Unreadable>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let listed = std::fs::read_dir(p).map(|d| {
            let mut v: Vec<PathBuf> = d
                .filter_map(|e| e.ok().map(|e| e.path()))
                // Whatever its type: one that is no file (a fifo, a link to a device or to
                // itself) is named as unreadable when opened, not passed over.
                .filter(|f| f.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            v.sort();
            v
        });
        match listed {
            Ok(v) if v.is_empty() => errors.push(Unreadable {
                file: p.display().to_string(),
                reason: "a directory with no trace files (*.jsonl) in it".into(),
            }),
            Ok(v) => out.extend(v),
            Err(e) => errors.push(Unreadable {
                file: p.display().to_string(),
                reason: format!("cannot list the directory: {e}"),
            }),
        }
    }
    out
}
