//! `[record]`: where traces go and the caps the recorder keeps the directory under, checked here
//! because the pruner is what an unchosen directory or a cap it cannot meet would harm.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecordConfig {
    /// Write each trainer session's lines to a trace file here; unset records nothing.
    pub dir: Option<PathBuf>,
    /// A trace file past this size is closed and continued in a new part (hello first).
    pub max_file_bytes: u64,
    /// The oldest finished traces are deleted to keep the directory under this size.
    pub max_total_bytes: u64,
    /// ...and under this many trace files: what the recorder remembers about them stays
    /// bounded whatever the number of sessions.
    pub max_files: usize,
}

impl Default for RecordConfig {
    fn default() -> Self {
        Self {
            dir: None,
            max_file_bytes: 64 << 20,
            max_total_bytes: 1 << 30,
            max_files: 10_000,
        }
    }
}

/// A `[record]` value the recorder cannot work with, named by its key in the config file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid {key} = {value:?}: {reason}")]
pub struct InvalidRecord {
    pub key: &'static str,
    pub value: String,
    pub reason: String,
}

impl RecordConfig {
    pub fn validate(&self) -> Result<(), InvalidRecord> {
        if let Some(dir) = &self.dir {
            // An empty path is the daemon's working directory and a relative one depends on it:
            // the pruner must never be pointed at a directory nobody chose.
            if dir.as_os_str().is_empty() || !dir.is_absolute() {
                return Err(InvalidRecord {
                    key: "record.dir",
                    value: dir.display().to_string(),
                    reason: "use an absolute path to a directory for gpumon's traces alone, e.g. \"/var/lib/gpumon/traces\"".into(),
                });
            }
        }
        for (key, v) in [
            ("record.max_total_bytes", self.max_total_bytes),
            ("record.max_file_bytes", self.max_file_bytes),
        ] {
            if v < 4096 {
                return Err(InvalidRecord {
                    key,
                    value: v.to_string(),
                    reason: "keep it at least 4096".into(),
                });
            }
        }
        if !(1..=1_000_000).contains(&self.max_files) {
            return Err(InvalidRecord {
                key: "record.max_files",
                value: self.max_files.to_string(),
                reason: "set it between 1 and 1000000".into(),
            });
        }
        if self.max_file_bytes > self.max_total_bytes {
            // Name the key the user most likely set: the one that is not at its default.
            let (key, value) = if self.max_file_bytes == Self::default().max_file_bytes {
                ("record.max_total_bytes", self.max_total_bytes)
            } else {
                ("record.max_file_bytes", self.max_file_bytes)
            };
            return Err(InvalidRecord {
                key,
                value: value.to_string(),
                reason: format!(
                    "record.max_file_bytes ({}) must be at most record.max_total_bytes ({})",
                    self.max_file_bytes, self.max_total_bytes
                ),
            });
        }
        Ok(())
    }
}
