//! A fixed-capacity time series. Missed samples are stored as explicit gaps, so a chart shows a
//! hole where the daemon saw nothing instead of drawing a line across it.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::core::model::Timestamp;

/// One slot: a value, or `None` for "no sample here".
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point<T> {
    pub ts: Timestamp,
    pub value: Option<T>,
}

#[derive(Debug, Clone)]
pub struct Series<T> {
    points: VecDeque<Point<T>>,
    capacity: usize,
}

impl<T: Copy> Series<T> {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            points: VecDeque::with_capacity(capacity.min(64)),
            capacity,
        }
    }

    /// Appends a sample. When the previous sample is more than 1.5 intervals old, a gap is
    /// inserted first: the poller missed at least one tick (stall, NVML hang, GPU error).
    pub fn push(&mut self, ts: Timestamp, value: Option<T>, interval: f64) {
        if let Some(last) = self.points.back() {
            let missed = ts - last.ts > 1.5 * interval;
            if missed && last.value.is_some() && value.is_some() {
                self.push_raw(last.ts + interval, None);
            }
        }
        self.push_raw(ts, value);
    }

    fn push_raw(&mut self, ts: Timestamp, value: Option<T>) {
        let len = self.points.len();
        if len == self.capacity {
            self.points.pop_front();
        } else if len == self.points.capacity() {
            // Doubling, but never past the limit: VecDeque's own growth would take a 300-point
            // series to 512 slots.
            self.points
                .reserve_exact(len.max(1).min(self.capacity - len));
        }
        self.points.push_back(Point { ts, value });
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

    /// Slots allocated now: at most `capacity()`.
    pub fn allocated(&self) -> usize {
        self.points.capacity()
    }

    pub fn last(&self) -> Option<&Point<T>> {
        self.points.back()
    }

    /// Points with `ts >= since`, oldest first.
    pub fn since(&self, since: Timestamp) -> impl Iterator<Item = &Point<T>> {
        let start = self.points.partition_point(|p| p.ts < since);
        self.points.range(start..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_capacity_points() {
        let mut s = Series::new(3);
        for i in 0..10 {
            s.push(i as f64, Some(i), 1.0);
        }
        assert_eq!(s.len(), 3);
        let vals: Vec<_> = s.since(0.0).map(|p| p.value).collect();
        assert_eq!(vals, vec![Some(7), Some(8), Some(9)]);
    }

    #[test]
    fn never_allocates_past_its_limit() {
        for limit in [1, 63, 64, 65, 300, 3600] {
            let mut s = Series::new(limit);
            for i in 0..2 * limit {
                s.push(i as f64, Some(i as u64), 1.0);
                assert!(s.allocated() <= limit, "{limit}: {} slots", s.allocated());
            }
            assert_eq!(s.len(), limit);
        }
    }

    #[test]
    fn missed_ticks_become_an_explicit_gap() {
        let mut s = Series::new(10);
        s.push(0.0, Some(1u64), 1.0);
        s.push(1.0, Some(2), 1.0);
        s.push(5.0, Some(3), 1.0);
        let pts: Vec<_> = s.since(0.0).copied().collect();
        assert_eq!(pts.len(), 4);
        assert_eq!(
            pts[2],
            Point {
                ts: 2.0,
                value: None
            }
        );
        assert_eq!(pts[3].value, Some(3));
    }

    #[test]
    fn since_filters_by_time() {
        let mut s = Series::new(10);
        for i in 0..5 {
            s.push(i as f64, Some(i), 1.0);
        }
        assert_eq!(s.since(3.0).count(), 2);
        assert_eq!(s.since(99.0).count(), 0);
    }
}
