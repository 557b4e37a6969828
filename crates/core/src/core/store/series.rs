//! A GPU's memory history, bounded and delta-encoded (chunks.rs): 2 bytes a point while
//! nothing moves, about 9 while memory and utilization change every poll, instead of 40. Missed samples are stored as explicit gaps, so a chart shows a
//! hole where the daemon saw nothing instead of drawing a line across it.
//!
//! A point after its time: a header byte (bit 0 a value, bit 1 utilization present, bits 2-5
//! used/reserved/free/utilization changed), then the change of each changed figure (the
//! utilization as its `f32` bits).

use serde::{Deserialize, Serialize};

use super::chunks::varint::{get_change, put_change};
use super::chunks::{millis, seconds, Chunks, Codec};
use super::GpuPoint;
use crate::core::model::Timestamp;

/// One slot: a value, or `None` for "no sample here".
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point<T> {
    pub ts: Timestamp,
    pub value: Option<T>,
}

const SOME: u8 = 1;
const UTIL: u8 = 1 << 1;
const CHANGED: u8 = 2;

#[derive(Debug, Clone)]
pub struct GpuCodec;

impl Codec for GpuCodec {
    type Value = Option<GpuPoint>;
    /// used, reserved, free, utilization bits.
    type State = [u64; 4];

    fn encode(s: &mut [u64; 4], v: &Option<GpuPoint>, out: &mut Vec<u8>) {
        let Some(p) = v else {
            out.push(0);
            return;
        };
        let util = p.utilization.map(|u| u64::from(u.to_bits()));
        let vals = [Some(p.used), Some(p.reserved), Some(p.free), util];
        let mut head = SOME | if util.is_some() { UTIL } else { 0 };
        for (i, v) in vals.iter().enumerate() {
            if v.is_some_and(|v| v != s[i]) {
                head |= 1 << (CHANGED + i as u8);
            }
        }
        out.push(head);
        for (i, v) in vals.iter().enumerate() {
            if let (true, Some(v)) = (head & (1 << (CHANGED + i as u8)) != 0, v) {
                put_change(out, s[i], *v);
                s[i] = *v;
            }
        }
    }

    fn decode(s: &mut [u64; 4], bytes: &[u8], at: &mut usize) -> Option<GpuPoint> {
        let head = bytes.get(*at).copied().unwrap_or_default();
        *at += 1;
        for (i, v) in s.iter_mut().enumerate() {
            if head & (1 << (CHANGED + i as u8)) != 0 {
                *v = get_change(bytes, at, *v);
            }
        }
        (head & SOME != 0).then(|| GpuPoint {
            used: s[0],
            reserved: s[1],
            free: s[2],
            utilization: (head & UTIL != 0).then(|| f32::from_bits(s[3] as u32)),
        })
    }
}

#[derive(Debug, Clone)]
pub struct Series(Chunks<GpuCodec>);

impl Series {
    pub fn new(capacity: usize) -> Self {
        Self(Chunks::new(capacity))
    }

    /// Appends a sample. When the previous sample is more than 1.5 intervals old, a gap is
    /// inserted first: the poller missed at least one tick (stall, NVML hang, GPU error).
    pub fn push(&mut self, ts: Timestamp, value: Option<GpuPoint>, interval: f64) {
        if let Some((last_ms, last)) = self.0.last() {
            let last_ts = seconds(last_ms);
            let missed = ts - last_ts > 1.5 * interval;
            if missed && last.is_some() && value.is_some() {
                self.0.push(millis(last_ts + interval), None);
            }
        }
        self.0.push(millis(ts), value);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes held by the points, allocated ahead included.
    pub fn allocated_bytes(&self) -> usize {
        self.0.allocated_bytes()
    }

    pub fn last(&self) -> Option<Point<GpuPoint>> {
        self.0.last().map(point)
    }

    /// Points with `ts >= since`, oldest first (a series is in time order: polls are).
    pub fn since(&self, since: Timestamp) -> impl Iterator<Item = Point<GpuPoint>> + '_ {
        self.0.since_ms(millis(since)).map(point)
    }
}

fn point((ms, value): (i64, Option<GpuPoint>)) -> Point<GpuPoint> {
    Point {
        ts: seconds(ms),
        value,
    }
}

#[cfg(test)]
mod tests;
