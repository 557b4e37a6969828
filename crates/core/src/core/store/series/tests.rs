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

/// `since` passes over the chunks before the time asked undecoded: the same points as reading
/// every point and skipping the early ones, at any time, in a series whose oldest points were
/// dropped mid-chunk and whose polls missed ticks.
#[test]
fn since_reads_the_same_points_as_a_scan_from_the_oldest() {
    let mut s = Series::new(1000);
    let mut t = 1e9;
    for i in 0..2345u64 {
        t += if i % 97 == 0 { 4.0 } else { 1.0 };
        s.push(t, (i % 13 != 0).then(|| gpu(i % 300)), 1.0);
    }
    let all: Vec<_> = s.since(0.0).collect();
    assert_eq!(all.len(), 1000);
    let first = all[0].ts;
    for k in 0..1300 {
        let at = first - 3.0 + k as f64 * 0.75;
        let scan: Vec<_> = all.iter().copied().filter(|p| p.ts >= at).collect();
        assert_eq!(s.since(at).collect::<Vec<_>>(), scan, "since {at}");
    }
}

/// A read of the newest points resumes at the newest chunk's mark when it can: the same points
/// as decoding that chunk from its start, for every count, before and after the oldest points
/// are dropped.
#[test]
fn newest_points_read_alike_from_the_mark_and_from_the_chunk_start() {
    for (capacity, pushes) in [(1000, 437), (1000, 1333), (50, 77), (3, 40)] {
        let mut s = Series::new(capacity);
        for i in 0..pushes {
            s.push(1e9 + i as f64, (i % 7 != 0).then(|| gpu(i % 300)), 1.0);
        }
        let all: Vec<_> = s.since(0.0).collect();
        assert_eq!(all.len(), capacity.min(pushes as usize));
        for n in 0..=all.len() + 1 {
            let tail: Vec<_> = s.0.newest(n).map(point).collect();
            assert_eq!(
                tail,
                all[all.len().saturating_sub(n)..],
                "capacity {capacity}, n {n}"
            );
        }
        for p in &all {
            let want: Vec<_> = all.iter().copied().filter(|q| q.ts >= p.ts).collect();
            assert_eq!(s.since(p.ts).collect::<Vec<_>>(), want);
        }
    }
}
