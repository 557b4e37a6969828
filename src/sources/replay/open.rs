//! Opening a trace: only a regular file is one. A fifo, a device or a socket is named as
//! unreadable rather than read: a fifo with no writer would block the open, /dev/zero would
//! never end.

use std::fs::{File, FileType};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// `path` opened for reading, or why it cannot be read as a trace. Opened without blocking
/// (a fifo's open waits for a writer otherwise), then its type is checked on what was opened,
/// so a path swapped after a look is no different.
pub(super) fn open_trace(path: &Path) -> Result<File, String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot open: {e}: unreadable; check the path and its permissions"))?;
    let kind = f
        .metadata()
        .map_err(|e| format!("cannot stat: {e}: unreadable"))?
        .file_type();
    if kind.is_file() {
        return Ok(f);
    }
    Err(not_a_file(kind))
}

/// Why a path of this type is no trace.
pub(super) fn not_a_file(kind: FileType) -> String {
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a fifo"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    format!("unreadable: not a regular file ({what}); gpumon analyze reads the trace files (*.jsonl) a daemon records")
}
