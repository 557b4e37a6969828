//! A session's step-boundary history, 32 bytes a point. `Point<SessionPoint>` takes 80 (four
//! `Option<u64>` of 16 bytes each, plus the timestamp), and 64 trainers with an hour of 1 Hz
//! history would need 20 MB for it alone. Here:
//! - timestamps are milliseconds from a per-series base, in an `i32` (±24 days; the base moves
//!   when a point falls outside), read back as `f64` seconds rounded to the millisecond;
//! - the three byte counts take 51 bits each (the protocol caps them at 2^50), with all ones
//!   meaning absent, so no `Option` padding; the step and train flags fill the spare bits;
//! - the buffer is allocated once at exactly its capacity, not grown to the next power of two.
//!
//! Readers get `Point<SessionPoint>` back, so the API's JSON keeps its shape.

use std::collections::VecDeque;

use super::ring::Point;
use crate::core::model::Timestamp;
use crate::core::trainer::SessionPoint;

const BITS: u32 = 51;
/// All ones: no value. Larger byte counts (never accepted by the protocol) saturate below it.
const ABSENT: u64 = (1 << BITS) - 1;
/// Bit positions of the flags, after the three byte counts.
const HAS_STEP: u32 = 3 * BITS;
const TRAIN: u32 = 3 * BITS + 1;

#[derive(Debug, Clone, Copy)]
struct Packed {
    /// Milliseconds from the series' base.
    ts: i32,
    /// `u32` halves keep the struct 4-byte aligned, hence 32 bytes instead of 40.
    step: [u32; 2],
    /// allocated, allocated_peak, reserved, HAS_STEP, TRAIN: 155 of 160 bits.
    bits: [u32; 5],
}

impl Packed {
    fn new(ts: i32, p: &SessionPoint) -> Self {
        let field = |v: Option<u64>| v.map_or(ABSENT, |v| v.min(ABSENT - 1));
        let mut all = [
            field(p.allocated),
            field(p.allocated_peak),
            field(p.reserved),
        ]
        .iter()
        .enumerate()
        .fold(Bits::default(), |b, (i, v)| b.with(i as u32 * BITS, *v));
        if p.step.is_some() {
            all = all.with(HAS_STEP, 1);
        }
        if p.train {
            all = all.with(TRAIN, 1);
        }
        let step = p.step.unwrap_or(0);
        Self {
            ts,
            step: [step as u32, (step >> 32) as u32],
            bits: all.words(),
        }
    }

    fn value(&self) -> SessionPoint {
        let b = Bits::from_words(self.bits);
        let field = |i: u32| Some(b.get(i * BITS, BITS)).filter(|v| *v != ABSENT);
        let step = u64::from(self.step[0]) | u64::from(self.step[1]) << 32;
        SessionPoint {
            step: (b.get(HAS_STEP, 1) == 1).then_some(step),
            train: b.get(TRAIN, 1) == 1,
            allocated: field(0),
            allocated_peak: field(1),
            reserved: field(2),
        }
    }
}

/// 160 bits: `lo` holds bits 0..128, `hi` the rest.
#[derive(Default, Clone, Copy)]
struct Bits {
    lo: u128,
    hi: u32,
}

impl Bits {
    fn from_words(w: [u32; 5]) -> Self {
        let lo = w[..4]
            .iter()
            .rev()
            .fold(0u128, |acc, x| acc << 32 | u128::from(*x));
        Self { lo, hi: w[4] }
    }

    fn words(self) -> [u32; 5] {
        let lo = self.lo;
        [
            lo as u32,
            (lo >> 32) as u32,
            (lo >> 64) as u32,
            (lo >> 96) as u32,
            self.hi,
        ]
    }

    /// Ors `v` in at bit `at`; `v` must fit its field (callers clamp).
    fn with(mut self, at: u32, v: u64) -> Self {
        if at < 128 {
            // Bits shifted past 127 drop out here and go to `hi` below.
            self.lo |= u128::from(v) << at;
        }
        if at + 64 > 128 {
            self.hi |= if at >= 128 {
                (v << (at - 128)) as u32
            } else {
                (v >> (128 - at)) as u32
            };
        }
        self
    }

    fn get(self, at: u32, len: u32) -> u64 {
        let wide = u128::from(self.hi) << 64 | (self.lo >> 64);
        let v = if at + len <= 128 {
            (self.lo >> at) as u64
        } else {
            (wide >> (at - 64)) as u64
        };
        v & ((1u64 << len) - 1)
    }
}

#[derive(Debug, Clone)]
pub struct SessionSeries {
    points: VecDeque<Packed>,
    capacity: usize,
    /// Milliseconds since the epoch that `Packed::ts` counts from.
    base_ms: i64,
}

impl SessionSeries {
    /// Gives back what was allocated ahead for points that will not come (an ended session).
    pub fn shrink_to_fit(&mut self) {
        self.points.shrink_to_fit();
    }

    pub fn new(capacity: usize) -> Self {
        Self {
            points: VecDeque::new(),
            capacity: capacity.max(1),
            base_ms: 0,
        }
    }

    /// Appends a point, dropping the oldest when full. Samples arrive at step boundaries, not on
    /// a clock, so there is no gap detection here.
    pub fn push(&mut self, ts: Timestamp, p: SessionPoint) {
        if self.points.len() == self.capacity {
            self.points.pop_front();
        } else if self.points.capacity() == 0 {
            // The whole ring at once: growing by doubling would leave a trail of freed buffers
            // (and end at 4096 slots for 3600). Pages the ring has not reached yet are not
            // resident, so a short session does not pay for a full one.
            self.points.reserve_exact(self.capacity);
        }
        let ms = millis(ts);
        if self.points.is_empty() {
            self.base_ms = ms;
        }
        let off = match i32::try_from(ms - self.base_ms) {
            Ok(off) => off,
            Err(_) => self.rebase(ms),
        };
        self.points.push_back(Packed::new(off, &p));
    }

    /// Moves the base so that `ms` fits, and returns its offset. Every point keeps its exact
    /// time when the series and `ms` span less than the offsets reach (~49 days): the base then
    /// leaves a quarter of the range above the newest time (time moves forward, so the next
    /// rebase is days away) unless that would push the oldest out. When they span more (a ring
    /// of very sparse points, or `ms` weeks away from the others), `ms` is exact and the points
    /// it cannot share a base with are clamped to the nearest time the range still holds:
    /// towards `ms`, never past it. (Rebasing as if `ms` were always the newest clamped the
    /// older-but-later points to the top of the range: 6.2 days after `ms`.)
    fn rebase(&mut self, ms: i64) -> i32 {
        let (min, max) = (i64::from(i32::MIN), i64::from(i32::MAX));
        let times = self.points.iter().map(|p| self.base_ms + i64::from(p.ts));
        let (lo, hi) = times.fold((ms, ms), |(lo, hi), t| (lo.min(t), hi.max(t)));
        let headroom = i64::from(i32::MAX / 4 * 3);
        // Saturating throughout: the protocol only lets Unix times of this century through.
        let base = if hi.saturating_sub(lo) <= max - min {
            // In [hi − max, lo − min], where both ends fit.
            hi.saturating_sub(headroom).min(lo.saturating_sub(min))
        } else if ms == hi {
            ms.saturating_sub(headroom)
        } else {
            // `ms` far behind the others: at the bottom, the later points as far up as fits.
            ms.saturating_sub(min)
        };
        let shift = self.base_ms.saturating_sub(base);
        for p in &mut self.points {
            p.ts = clamp_i32(i64::from(p.ts).saturating_add(shift));
        }
        self.base_ms = base;
        clamp_i32(ms.saturating_sub(base))
    }

    fn ts(&self, p: &Packed) -> Timestamp {
        (self.base_ms + i64::from(p.ts)) as f64 / 1000.0
    }

    fn point(&self, p: &Packed) -> Point<SessionPoint> {
        Point {
            ts: self.ts(p),
            value: Some(p.value()),
        }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held by the points buffer.
    pub fn allocated_bytes(&self) -> usize {
        self.points.capacity() * std::mem::size_of::<Packed>()
    }

    pub fn last(&self) -> Option<Point<SessionPoint>> {
        self.points.back().map(|p| self.point(p))
    }

    /// All points, oldest first.
    pub fn iter(
        &self,
    ) -> impl DoubleEndedIterator<Item = Point<SessionPoint>> + ExactSizeIterator + '_ {
        self.points.iter().map(|p| self.point(p))
    }

    /// Points with `ts >= since`, oldest first (samples are expected in time order).
    pub fn since(&self, since: Timestamp) -> impl Iterator<Item = Point<SessionPoint>> + '_ {
        let since = millis(since);
        let start = self
            .points
            .partition_point(|p| self.base_ms + i64::from(p.ts) < since);
        self.points.range(start..).map(|p| self.point(p))
    }
}

fn millis(ts: Timestamp) -> i64 {
    // Saturating: the protocol only lets Unix times of this century through.
    (ts * 1000.0).round() as i64
}

fn clamp_i32(v: i64) -> i32 {
    v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(step: Option<u64>, train: bool, v: [Option<u64>; 3]) -> SessionPoint {
        SessionPoint {
            step,
            train,
            allocated: v[0],
            allocated_peak: v[1],
            reserved: v[2],
        }
    }

    #[test]
    fn points_come_back_as_pushed_with_time_to_the_millisecond() {
        let cases = [
            pt(None, false, [None, None, None]),
            pt(Some(0), true, [Some(0), None, Some(1 << 50)]),
            pt(Some(u64::MAX), false, [Some(21_474_836_480), Some(1), None]),
            pt(
                Some(7),
                true,
                [None, Some(30_064_771_072), Some(ABSENT - 1)],
            ),
            pt(
                Some(1 << 33),
                false,
                [Some(1 << 50), Some(1 << 50), Some(1 << 50)],
            ),
        ];
        let mut s = SessionSeries::new(10);
        for (i, p) in cases.iter().enumerate() {
            s.push(1_763_700_000.123_456 + i as f64 * 0.25, *p);
        }
        let back: Vec<_> = s.iter().collect();
        assert_eq!(back.len(), cases.len());
        for (i, (got, want)) in back.iter().zip(&cases).enumerate() {
            let ms = 1_763_700_000_123 + 250 * i as i64;
            assert_eq!(got.ts, ms as f64 / 1000.0, "case {i}");
            assert_eq!(got.value.as_ref(), Some(want), "case {i}");
        }
        assert_eq!(s.last().unwrap().value, Some(cases[4]));
        assert_eq!(std::mem::size_of::<Packed>(), 32);
    }

    #[test]
    fn keeps_the_newest_capacity_points_in_exactly_that_much_memory() {
        let mut s = SessionSeries::new(3600);
        for i in 0..10_000u64 {
            s.push(1e9 + i as f64, pt(Some(i), true, [Some(i), None, None]));
        }
        assert_eq!(s.len(), 3600);
        assert_eq!(s.iter().next().unwrap().value.unwrap().step, Some(6400));
        assert_eq!(s.allocated_bytes(), 3600 * 32);
        assert_eq!(s.since(1e9 + 9998.0).count(), 2);
        assert_eq!(s.since(f64::MIN).count(), 3600);
    }

    #[test]
    fn a_session_longer_than_the_offset_range_keeps_exact_times() {
        let mut s = SessionSeries::new(4);
        let day = 86_400.0;
        let times = [1e9, 1e9 + 20.0 * day, 1e9 + 40.0 * day, 1e9 + 41.5 * day];
        for (i, t) in times.iter().enumerate() {
            s.push(*t, pt(Some(i as u64), true, [None; 3]));
        }
        let got: Vec<f64> = s.iter().map(|p| p.ts).collect();
        assert_eq!(got, times);
        // Far beyond: the oldest point can no longer be expressed and is clamped, not wrapped.
        s.push(1e9 + 100.0 * day, pt(None, false, [None; 3]));
        let got: Vec<f64> = s.iter().map(|p| p.ts).collect();
        assert_eq!(got[3], 1e9 + 100.0 * day);
        assert!(got.windows(2).all(|w| w[0] <= w[1]), "{got:?}");
    }

    /// Points accepted far in the future (30 days), then points at the right time: the rebase
    /// for the later ones assumed time only moves forward, clamped the first seven to the top of
    /// the offset range, and they read back 6.2 days after the newest point.
    #[test]
    fn a_point_far_behind_the_others_keeps_every_time_exact() {
        let (now, day) = (1_763_700_000.0, 86_400.0);
        let mut s = SessionSeries::new(16);
        let mut times: Vec<f64> = (0..7).map(|i| now + 30.0 * day + f64::from(i)).collect();
        times.extend((0..5).map(|i| now + f64::from(i)));
        for (i, t) in times.iter().enumerate() {
            s.push(*t, pt(Some(i as u64), true, [None; 3]));
        }
        let got: Vec<f64> = s.iter().map(|p| p.ts).collect();
        assert_eq!(got, times);
        // Further back than the offsets can reach from the others (60 days): the new point is
        // exact, and those it cannot share a base with are clamped towards it, never past it.
        s.push(now - 60.0 * day, pt(None, false, [None; 3]));
        let got: Vec<f64> = s.iter().map(|p| p.ts).collect();
        assert_eq!(got.last(), Some(&(now - 60.0 * day)));
        for (g, t) in got.iter().zip(&times) {
            assert!(*g <= *t && *g > now - 60.0 * day, "{g} for {t}");
        }
    }

    /// Through the session store: samples stamped far from their arrival (a wrong clock, a
    /// hostile client) go into the history at their arrival and are counted; samples resent
    /// minutes late, and those a little ahead, keep their own time.
    #[test]
    fn sessions_take_untrusted_times_at_their_arrival() {
        use crate::core::store::sessions::{SessionLimits, Sessions};
        use crate::core::trainer::Peer;
        use crate::core::trainer::{Hello, Sample, Stats};

        let (t0, day) = (1_763_700_000.0, 86_400.0);
        let mut s = Sessions::new(SessionLimits::default());
        let peer = Peer {
            pid: 1,
            uid: 0,
            gid: 0,
        };
        let (key, _) = s.open(peer, Hello::default(), t0);
        let sample = |ts: f64, step: u64| Sample {
            ts,
            step: Some(step),
            phase: "train".into(),
            stats: Stats::default(),
            device_free: None,
            device_total: None,
            alloc_limit: None,
        };
        // (sent ts, arrival, where it lands)
        let cases = [
            (t0 + 30.0 * day, t0, t0),
            (t0 + 30.0 * day + 1.0, t0 + 1.0, t0 + 1.0),
            (t0 - 1_800.0, t0 + 2.0, t0 - 1_800.0),
            (t0 - 3_700.0, t0 + 3.0, t0 + 3.0),
            (t0 + 4.0 + 290.0, t0 + 4.0, t0 + 294.0),
            (t0 + 5.0 + 310.0, t0 + 5.0, t0 + 5.0),
            (t0 + 6.0, t0 + 6.0, t0 + 6.0),
        ];
        for (i, (ts, now, _)) in cases.iter().enumerate() {
            s.sample(key, sample(*ts, i as u64), *now);
        }
        let sess = s.live().next().unwrap();
        let got: Vec<f64> = sess.series.iter().map(|p| p.ts).collect();
        let want: Vec<f64> = cases.iter().map(|c| c.2).collect();
        assert_eq!(got, want);
        assert_eq!(s.timestamps_clamped, 4);
        assert_eq!(sess.last_sample.as_ref().map(|(ts, _)| *ts), Some(t0 + 6.0));
    }

    #[test]
    fn byte_counts_beyond_51_bits_saturate_instead_of_corrupting_flags() {
        let mut s = SessionSeries::new(1);
        s.push(1e9, pt(None, true, [Some(u64::MAX), None, Some(u64::MAX)]));
        let p = s.last().unwrap().value.unwrap();
        assert_eq!(p.allocated, Some(ABSENT - 1));
        assert_eq!(p.reserved, Some(ABSENT - 1));
        assert_eq!((p.step, p.train, p.allocated_peak), (None, true, None));
    }
}
