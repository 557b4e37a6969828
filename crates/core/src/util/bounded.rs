//! A FIFO with a fixed capacity that drops its oldest entry to take a new one and counts what it
//! dropped (the tokio-console habit: never block, never grow, and say how much was lost). It
//! never allocates past its capacity: it grows by doubling up to it, exactly.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub struct Bounded<T> {
    items: VecDeque<T>,
    capacity: usize,
    dropped: u64,
}

impl<T> Bounded<T> {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            items: VecDeque::new(),
            capacity,
            dropped: 0,
        }
    }

    /// Appends `item`; when full, the oldest entry is dropped, counted and returned.
    pub fn push(&mut self, item: T) -> Option<T> {
        let len = self.items.len();
        let dropped = if len == self.capacity {
            self.dropped += 1;
            self.items.pop_front()
        } else {
            if len == self.items.capacity() {
                self.items
                    .reserve_exact(len.max(4).min(self.capacity - len));
            }
            None
        };
        self.items.push_back(item);
        dropped
    }

    /// Entries dropped to make room since this queue was made.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots allocated now: never more than `capacity()`.
    pub fn allocated(&self) -> usize {
        self.items.capacity()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.items.iter()
    }

    /// The `i`th entry, oldest first.
    pub fn get(&self, i: usize) -> Option<&T> {
        self.items.get(i)
    }

    pub fn back(&self) -> Option<&T> {
        self.items.back()
    }

    pub fn pop_front(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    /// Takes every entry, oldest first.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.items.drain(..)
    }

    pub fn clear(&mut self) {
        self.items.clear();
    }
}

#[cfg(test)]
mod tests;
