//! A bounded history, delta-encoded in chunks of 120 points after Prometheus' TSDB and
//! Facebook's Gorilla: consecutive samples differ mostly in their time (about the same gap
//! again) and in a figure or two, so each point stores the change of its gap and of what
//! changed, as varints, and a codec's flag for what did not. A trainer's hour at 1 Hz takes
//! about 6 bytes a point instead of 32 packed (80 as `Point<SessionPoint>`), a GPU's 2-9
//! instead of 40.
//! - Times are `i64` milliseconds, so no time is clamped.
//! - Dropping the oldest point is a count (`skip`) until its whole chunk is gone: exactly
//!   `capacity` points, in at most one chunk more than they need.
//! - A chunk is shrunk to its bytes when it fills; only the newest one has room to grow.
//! - Reads decode forward; those of the newest `n`, or of the points since a time, pass over
//!   whole older chunks undecoded, and start in the newest chunk at its latest mark (every 16
//!   points) when they can.

use std::collections::VecDeque;
use std::fmt::Debug;

pub mod varint;
use varint::{get, put, unzigzag, zigzag};

/// Points per chunk: Prometheus' choice. A read that starts mid-history decodes at most this
/// many points it does not return.
const CHUNK: usize = 120;

/// How one kind of point is written after its time.
pub trait Codec {
    type Value: Copy + Debug;
    /// What the next point is encoded against; a chunk starts from the default, so it decodes
    /// alone.
    type State: Copy + Default + Debug;
    fn encode(state: &mut Self::State, v: &Self::Value, out: &mut Vec<u8>);
    fn decode(state: &mut Self::State, bytes: &[u8], at: &mut usize) -> Self::Value;
}

#[derive(Debug, Clone, Copy, Default)]
struct Clock {
    ms: i64,
    gap: i64,
}

#[derive(Debug, Clone)]
struct Chunk {
    len: u16,
    bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Chunks<C: Codec> {
    chunks: VecDeque<Chunk>,
    /// Where the next point appends: only the newest chunk is appended to, and a new one starts
    /// from the default.
    end: (Clock, C::State),
    /// Points of the oldest chunk that have been dropped.
    skip: usize,
    len: usize,
    capacity: usize,
    last: Option<(i64, C::Value)>,
    /// Where decoding the newest chunk can resume: after its latest multiple of `MARK` points.
    mark: Option<Mark<C::State>>,
}

/// Points between the resume marks of the newest chunk: a read of its newest points decodes at
/// most this many it does not return, instead of up to a chunk's.
const MARK: u16 = 16;

#[derive(Debug, Clone, Copy)]
struct Mark<S> {
    /// Points of the newest chunk before the mark, and the bytes they take.
    points: u16,
    at: usize,
    end: (Clock, S),
}

impl<C: Codec> Chunks<C> {
    pub fn new(capacity: usize) -> Self {
        Self {
            chunks: VecDeque::new(),
            end: Default::default(),
            skip: 0,
            len: 0,
            capacity: capacity.max(1),
            last: None,
            mark: None,
        }
    }

    /// Appends a point at `ms`, dropping the oldest when full.
    pub fn push(&mut self, ms: i64, v: C::Value) {
        if self.len == self.capacity {
            self.skip += 1;
            self.len -= 1;
            if self
                .chunks
                .front()
                .is_some_and(|c| self.skip == usize::from(c.len))
            {
                self.chunks.pop_front();
                self.skip = 0;
            }
        }
        if self
            .chunks
            .back()
            .is_none_or(|c| usize::from(c.len) == CHUNK)
        {
            // The chunk before is done: give back its spare room, and start the next one at
            // about its size (the chunks of one series encode alike).
            let size = self.chunks.back_mut().map_or(CHUNK * 4, |c| {
                c.bytes.shrink_to_fit();
                c.bytes.len() + c.bytes.len() / 8
            });
            self.chunks.push_back(Chunk {
                len: 0,
                bytes: Vec::with_capacity(size),
            });
            self.end = Default::default();
            self.mark = None;
        }
        if let Some(c) = self.chunks.back_mut() {
            let (clock, state) = &mut self.end;
            let gap = ms.wrapping_sub(clock.ms);
            put(&mut c.bytes, zigzag(gap.wrapping_sub(clock.gap)));
            *clock = Clock { ms, gap };
            C::encode(state, &v, &mut c.bytes);
            c.len += 1;
            if c.len % MARK == 0 {
                self.mark = Some(Mark {
                    points: c.len,
                    at: c.bytes.len(),
                    end: self.end,
                });
            }
        }
        self.len += 1;
        self.last = Some((ms, v));
    }

    /// Gives back what was allocated ahead for points that will not come (an ended session).
    pub fn shrink_to_fit(&mut self) {
        if let Some(c) = self.chunks.back_mut() {
            c.bytes.shrink_to_fit();
        }
        self.chunks.shrink_to_fit();
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held by the points, allocated ahead included.
    pub fn allocated_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Chunk>()
            + self
                .chunks
                .iter()
                .map(|c| c.bytes.capacity())
                .sum::<usize>()
    }

    pub fn last(&self) -> Option<(i64, C::Value)> {
        self.last
    }

    /// The points at or after `ms`, oldest first, for points pushed in time order. The chunks
    /// that start after `ms` are counted by their first point's time, which a chunk holds whole,
    /// so only the chunk that holds `ms` is decoded, from its start or its mark: a delta asking
    /// for a second of a full hour decodes a few points, not 30 chunks.
    pub fn since_ms(&self, ms: i64) -> impl Iterator<Item = (i64, C::Value)> + '_ {
        let mut n = 0;
        for (i, c) in self.chunks.iter().enumerate().rev() {
            // All of them after the newest chunk's mark: decode from there.
            let newest = i + 1 == self.chunks.len();
            if let Some(m) = self.mark.filter(|m| newest && m.end.0.ms < ms) {
                n = usize::from(c.len - m.points);
                break;
            }
            n += usize::from(c.len);
            if first_ms(c).is_some_and(|first| first <= ms) {
                break;
            }
        }
        self.newest(n).skip_while(move |(t, _)| *t < ms)
    }

    /// The newest `n` points (all of them when there are fewer), oldest first.
    pub fn newest(&self, n: usize) -> Iter<'_, C> {
        let n = n.min(self.len);
        let mut skip = self.skip + (self.len - n);
        let mut first = 0;
        while let Some(c) = self.chunks.get(first) {
            if skip < usize::from(c.len) {
                break;
            }
            skip -= usize::from(c.len);
            first += 1;
        }
        let mut iter = Iter {
            chunks: &self.chunks,
            next_chunk: first,
            bytes: &[],
            at: 0,
            end: Default::default(),
            skip,
            left: n,
        };
        // Starting in the newest chunk past its mark: resume there.
        if let (Some(m), Some(c)) = (self.mark, self.chunks.back()) {
            if first + 1 == self.chunks.len() && skip >= usize::from(m.points) {
                iter.bytes = &c.bytes;
                iter.at = m.at;
                iter.end = m.end;
                iter.next_chunk = first + 1;
                iter.skip = skip - usize::from(m.points);
            }
        }
        iter
    }
}

/// The time of a chunk's first point: its gap from the zero clock a chunk starts from, its first bytes.
fn first_ms(c: &Chunk) -> Option<i64> {
    (c.len > 0).then(|| unzigzag(get(&c.bytes, &mut 0)))
}

pub struct Iter<'a, C: Codec> {
    chunks: &'a VecDeque<Chunk>,
    next_chunk: usize,
    /// The chunk being decoded, where in it, and the state after the point before.
    bytes: &'a [u8],
    at: usize,
    end: (Clock, C::State),
    /// Points still to pass over at the start of the first chunk.
    skip: usize,
    left: usize,
}

impl<C: Codec> Iterator for Iter<'_, C> {
    type Item = (i64, C::Value);

    fn next(&mut self) -> Option<Self::Item> {
        while self.left > 0 {
            if self.at >= self.bytes.len() {
                self.bytes = &self.chunks.get(self.next_chunk)?.bytes;
                self.next_chunk += 1;
                self.at = 0;
                self.end = Default::default();
                continue;
            }
            let (clock, state) = &mut self.end;
            clock.gap = clock
                .gap
                .wrapping_add(unzigzag(get(self.bytes, &mut self.at)));
            clock.ms = clock.ms.wrapping_add(clock.gap);
            let v = C::decode(state, self.bytes, &mut self.at);
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            self.left -= 1;
            return Some((clock.ms, v));
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<C: Codec> ExactSizeIterator for Iter<'_, C> {}

/// Milliseconds of a protocol or poll time.
pub fn millis(ts: f64) -> i64 {
    // Saturating: the protocol only lets Unix times of this century through.
    (ts * 1000.0).round() as i64
}

pub fn seconds(ms: i64) -> f64 {
    ms as f64 / 1000.0
}
