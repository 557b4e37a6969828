//! A session's step-boundary history: the newest `capacity` points, delta-encoded in chunks
//! (chunks.rs), about 6 bytes a point at 1 Hz. 64 trainers with an hour each hold 1.4 MiB, not
//! 7.2 as 32-byte packed points. Readers get `Point<SessionPoint>` back, so the API's JSON
//! keeps its shape; times are rounded to the millisecond.
//!
//! A point after its time: a header byte (bit 0 has step, bit 1 train, bits 2-4
//! allocated/peak/reserved present, bits 5-7 each present one differs from the last present
//! one), the change of the step delta when there is a step (zigzag, wrapping), then the change
//! of each changed byte count. The worst the protocol lets through (any step, byte counts up
//! to 2^50, times within an hour) is 4 + 1 + 10 + 3 x 8 = 39 bytes.

use super::chunks::varint::{get, get_change, put, put_change, unzigzag, zigzag};
use super::chunks::{millis, seconds, Chunks, Codec};
use super::series::Point;
use crate::core::model::Timestamp;
use crate::core::trainer::SessionPoint;

const HAS_STEP: u8 = 1;
const TRAIN: u8 = 1 << 1;
const PRESENT: u8 = 2;
const CHANGED: u8 = 5;

#[derive(Debug, Clone, Copy, Default)]
pub struct State {
    step: u64,
    step_delta: i64,
    values: [u64; 3],
}

#[derive(Debug, Clone)]
pub struct SessionCodec;

impl Codec for SessionCodec {
    type Value = SessionPoint;
    type State = State;

    fn encode(s: &mut State, p: &SessionPoint, out: &mut Vec<u8>) {
        let vals = [p.allocated, p.allocated_peak, p.reserved];
        let mut head = 0u8;
        if p.step.is_some() {
            head |= HAS_STEP;
        }
        if p.train {
            head |= TRAIN;
        }
        for (i, v) in vals.iter().enumerate() {
            if let Some(v) = v {
                head |= 1 << (PRESENT + i as u8);
                if *v != s.values[i] {
                    head |= 1 << (CHANGED + i as u8);
                }
            }
        }
        out.push(head);
        if let Some(step) = p.step {
            let delta = step.wrapping_sub(s.step) as i64;
            put(out, zigzag(delta.wrapping_sub(s.step_delta)));
            (s.step, s.step_delta) = (step, delta);
        }
        for (i, v) in vals.iter().enumerate() {
            if let (true, Some(v)) = (head & (1 << (CHANGED + i as u8)) != 0, v) {
                put_change(out, s.values[i], *v);
                s.values[i] = *v;
            }
        }
    }

    fn decode(s: &mut State, bytes: &[u8], at: &mut usize) -> SessionPoint {
        let head = bytes.get(*at).copied().unwrap_or_default();
        *at += 1;
        let step = (head & HAS_STEP != 0).then(|| {
            s.step_delta = s.step_delta.wrapping_add(unzigzag(get(bytes, at)));
            s.step = s.step.wrapping_add(s.step_delta as u64);
            s.step
        });
        let mut vals = [None; 3];
        for (i, out) in vals.iter_mut().enumerate() {
            if head & (1 << (CHANGED + i as u8)) != 0 {
                s.values[i] = get_change(bytes, at, s.values[i]);
            }
            if head & (1 << (PRESENT + i as u8)) != 0 {
                *out = Some(s.values[i]);
            }
        }
        SessionPoint {
            step,
            train: head & TRAIN != 0,
            allocated: vals[0],
            allocated_peak: vals[1],
            reserved: vals[2],
        }
    }
}

#[derive(Debug, Clone)]
pub struct SessionSeries(Chunks<SessionCodec>);

impl SessionSeries {
    pub fn new(capacity: usize) -> Self {
        Self(Chunks::new(capacity))
    }

    /// Appends a point, dropping the oldest when full. Samples arrive at step boundaries, not on
    /// a clock, so there is no gap detection here.
    pub fn push(&mut self, ts: Timestamp, p: SessionPoint) {
        self.0.push(millis(ts), p);
    }

    /// Gives back what was allocated ahead for points that will not come (an ended session).
    pub fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn allocated_bytes(&self) -> usize {
        self.0.allocated_bytes()
    }

    pub fn last(&self) -> Option<Point<SessionPoint>> {
        self.0.last().map(point)
    }

    /// All points, oldest first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Point<SessionPoint>> + '_ {
        self.newest(self.len())
    }

    /// The newest `n` points, oldest first.
    pub fn newest(&self, n: usize) -> impl ExactSizeIterator<Item = Point<SessionPoint>> + '_ {
        self.0.newest(n).map(point)
    }
}

fn point((ms, p): (i64, SessionPoint)) -> Point<SessionPoint> {
    Point {
        ts: seconds(ms),
        value: Some(p),
    }
}

#[cfg(test)]
mod tests;
