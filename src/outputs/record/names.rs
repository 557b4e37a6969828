//! Which files in the record directory are gpumon's: a name `gpumon-*.trace.jsonl`, a regular
//! file (not a link), whose first line is a protocol hello. Only such files are ever deleted.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::core::trace::{self, MAX_LINE};

pub use crate::core::trace::file_name::{base, PREFIX, SUFFIX};

/// Left in the directory: says whose it is, and proves at start that it is writable.
pub const MARKER: &str = ".gpumon-record-dir";
pub const MARKER_TEXT: &str = "This directory holds gpumon trace files (gpumon analyze). gpumon \
deletes only files named gpumon-*.trace.jsonl that begin with a hello line; anything else here is left alone.\n";

/// Identity of a file on disk, so a file replaced under the same name is not deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ident {
    pub dev: u64,
    pub ino: u64,
}

impl Ident {
    pub fn of(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// The file name of part `part` (0 first), `n` > 1 when that name was taken.
pub fn part_name(base: &str, part: u32, n: u32) -> String {
    let p = if part == 0 {
        String::new()
    } else {
        format!(".p{part}")
    };
    let n = if n > 1 {
        format!("-{n}")
    } else {
        String::new()
    };
    format!("{base}{p}{n}{SUFFIX}")
}

pub fn has_our_name(name: &str) -> bool {
    name.starts_with(PREFIX) && name.ends_with(SUFFIX) && name.len() > PREFIX.len() + SUFFIX.len()
}

/// A file gpumon wrote: our name, a regular file, and a hello first. Its size and identity.
/// A trace of gpumon's found in the directory.
pub struct Ours {
    pub len: u64,
    pub modified: std::time::SystemTime,
    pub ident: Ident,
    /// Its hello's `instance`.
    pub instance: Option<String>,
}

pub fn ours(path: &Path) -> Option<Ours> {
    let name = path.file_name()?.to_str()?;
    if !has_our_name(name) {
        return None;
    }
    let m = std::fs::symlink_metadata(path).ok()?;
    if !m.file_type().is_file() {
        return None;
    }
    let f = std::fs::File::open(path).ok()?;
    let mut first = Vec::new();
    BufReader::new(f)
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut first)
        .ok()?;
    let line = first.strip_suffix(b"\n").unwrap_or(&first);
    if !trace::is_hello(line) {
        return None;
    }
    Some(Ours {
        len: m.len(),
        modified: m.modified().ok()?,
        ident: Ident::of(&m),
        instance: trace::hello_instance(line),
    })
}
