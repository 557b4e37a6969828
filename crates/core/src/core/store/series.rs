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
        let since = millis(since);
        self.0
            .newest(self.len())
            .skip_while(move |(ms, _)| *ms < since)
            .map(point)
    }
}

fn point((ms, value): (i64, Option<GpuPoint>)) -> Point<GpuPoint> {
    Point {
        ts: seconds(ms),
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u64) -> GpuPoint {
        GpuPoint {
            used: (40 << 30) + i * (2 << 20),
            reserved: 567_279_616,
            free: (39 << 30) - i * (2 << 20),
            utilization: (i % 3 != 0).then_some(i as f32 * 0.5),
        }
    }

    #[test]
    fn keeps_exactly_the_newest_capacity_points() {
        let mut s = Series::new(3);
        for i in 0..10 {
            s.push(i as f64, Some(gpu(i)), 1.0);
        }
        assert_eq!(s.len(), 3);
        let vals: Vec<_> = s.since(0.0).map(|p| p.value).collect();
        assert_eq!(vals, vec![Some(gpu(7)), Some(gpu(8)), Some(gpu(9))]);
        assert_eq!(s.last().map(|p| p.value), Some(Some(gpu(9))));
    }

    /// An hour of a GPU polled every second whose memory and utilization move every poll: about
    /// 9 bytes a point (an idle GPU's take 2), where `Point<GpuPoint>` takes 40.
    #[test]
    fn an_hour_of_polls_takes_a_few_bytes_a_point() {
        let mut s = Series::new(3600);
        for i in 0..7200u64 {
            s.push(1e9 + i as f64, Some(gpu(i % 300)), 1.0);
        }
        let pts: Vec<_> = s.since(0.0).collect();
        assert_eq!(pts.len(), 3600);
        for (k, p) in pts.iter().enumerate() {
            let i = 3600 + k as u64;
            assert_eq!((p.ts, p.value), (1e9 + i as f64, Some(gpu(i % 300))));
        }
        assert!(s.allocated_bytes() < 3600 * 10, "{}", s.allocated_bytes());
    }

    #[test]
    fn missed_ticks_become_an_explicit_gap() {
        let mut s = Series::new(10);
        s.push(0.0, Some(gpu(1)), 1.0);
        s.push(1.0, Some(gpu(2)), 1.0);
        s.push(5.0, Some(gpu(3)), 1.0);
        s.push(6.0, None, 1.0);
        let pts: Vec<_> = s.since(0.0).collect();
        assert_eq!(pts.len(), 5);
        assert_eq!(
            pts[2],
            Point {
                ts: 2.0,
                value: None
            }
        );
        assert_eq!(pts[3].value, Some(gpu(3)));
        assert_eq!(pts[4].value, None);
    }

    #[test]
    fn since_filters_by_time() {
        let mut s = Series::new(10);
        for i in 0..5 {
            s.push(i as f64, Some(gpu(i)), 1.0);
        }
        assert_eq!(s.since(3.0).count(), 2);
        assert_eq!(s.since(99.0).count(), 0);
    }
}
