//! The finished traces the recorder may delete, oldest first. Kept in two contiguous buffers
//! (names in one, the rest in a ring), not an allocation per file: a flood of short sessions
//! leaves tens of thousands of entries, and small long-lived allocations scattered among the
//! flood's short-lived ones pin pages the allocator can then never give back.

use std::collections::VecDeque;

use super::names::Ident;

struct Entry {
    /// Where the file name lies in `names`; its hello's `instance` follows it there.
    at: usize,
    len: usize,
    instance_len: usize,
    bytes: u64,
    ident: Ident,
}

/// A finished trace: its file name in the record directory, size and identity.
pub struct Finished {
    pub name: String,
    pub bytes: u64,
    pub ident: Ident,
}

#[derive(Default)]
pub struct Index {
    names: Vec<u8>,
    entries: VecDeque<Entry>,
    /// Bytes at the front of `names` whose entries were taken (entries leave oldest first).
    dead: usize,
}

/// Names given up are compacted away once they are this many bytes and half the buffer.
const COMPACT_AT: usize = 64 * 1024;

impl Index {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn push(&mut self, name: &str, instance: Option<&str>, bytes: u64, ident: Ident) {
        let instance = instance.unwrap_or_default();
        self.entries.push_back(Entry {
            at: self.names.len(),
            len: name.len(),
            instance_len: instance.len(),
            bytes,
            ident,
        });
        self.names.extend_from_slice(name.as_bytes());
        self.names.extend_from_slice(instance.as_bytes());
    }

    /// The newest trace whose hello named `instance`.
    pub fn newest_of(&self, instance: &str) -> Option<String> {
        let e = self.entries.iter().rev().find(|e| {
            let from = e.at + e.len;
            e.instance_len == instance.len()
                && self.names.get(from..from + e.instance_len) == Some(instance.as_bytes())
        })?;
        let name = self.names.get(e.at..e.at + e.len)?;
        Some(String::from_utf8_lossy(name).into_owned())
    }

    /// Takes the oldest.
    pub fn pop_oldest(&mut self) -> Option<Finished> {
        let e = self.entries.pop_front()?;
        let name = self
            .names
            .get(e.at..e.at + e.len)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default();
        self.dead = e.at + e.len + e.instance_len;
        if self.entries.is_empty() {
            self.names.clear();
            self.dead = 0;
        } else if self.dead >= COMPACT_AT && self.dead * 2 >= self.names.len() {
            self.names.drain(..self.dead);
            for e in &mut self.entries {
                e.at -= self.dead;
            }
            self.dead = 0;
        }
        if self.names.capacity() > COMPACT_AT && self.names.len() * 4 < self.names.capacity() {
            self.names.shrink_to(self.names.len() * 2);
        }
        if self.entries.capacity() > 1024 && self.entries.len() * 4 < self.entries.capacity() {
            self.entries.shrink_to(self.entries.len() * 2);
        }
        Some(Finished {
            name,
            bytes: e.bytes,
            ident: e.ident,
        })
    }
}

#[cfg(test)]
mod tests;
