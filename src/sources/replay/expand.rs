//! What `gpumon analyze` reads: its arguments, a directory standing for its trace files, and
//! the files grouped by the daemon that recorded them.

use std::path::{Path, PathBuf};

use super::Unreadable;

/// The files to read, by node: a directory stands for the trace files in it (`*.jsonl`, by
/// name), as `--record-dir` leaves them, and is one node (one daemon). A file named on its own
/// belongs to the node of its directory: one daemon writes one record directory, so traces
/// side by side were one daemon's sessions. Nodes keep the order in which their first file was
/// given; a file given twice is read once.
pub(super) fn nodes(paths: &[PathBuf], errors: &mut Vec<Unreadable>) -> Vec<Vec<PathBuf>> {
    let mut keys: Vec<PathBuf> = Vec::new();
    let mut out: Vec<Vec<PathBuf>> = Vec::new();
    let mut add = |dir: &Path, file: PathBuf| {
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let i = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                keys.push(key);
                out.push(Vec::new());
                out.len() - 1
            }
        };
        if let Some(files) = out.get_mut(i) {
            if !files.contains(&file) {
                files.push(file);
            }
        }
    };
    for p in paths {
        if !p.is_dir() {
            let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
            add(dir.unwrap_or(Path::new(".")), p.clone());
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
            Ok(v) => {
                for f in v {
                    add(p, f);
                }
            }
            Err(e) => errors.push(Unreadable {
                file: p.display().to_string(),
                reason: format!("cannot list the directory: {e}"),
            }),
        }
    }
    out
}
