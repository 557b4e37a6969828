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
            [None, Some(30_064_771_072), Some((1 << 51) - 2)],
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
}

/// A 1 Hz trainer whose allocated bytes change every step, for an hour and a half: the
/// series keeps exactly the newest 3600 points, in chunks of about 7 bytes a point.
#[test]
fn keeps_exactly_the_newest_capacity_points_in_a_few_bytes_each() {
    let mut s = SessionSeries::new(3600);
    let at = |i: u64| {
        pt(
            Some(i),
            true,
            [Some((8 << 30) + (i % 977) * 4096), None, None],
        )
    };
    for i in 0..5_400u64 {
        s.push(1e9 + i as f64, at(i));
        assert_eq!(s.len(), (i as usize + 1).min(3600));
    }
    let all: Vec<_> = s.iter().collect();
    assert_eq!(all.len(), 3600);
    for (k, p) in all.iter().enumerate() {
        let i = 1_800 + k as u64;
        assert_eq!((p.ts, p.value), (1e9 + i as f64, Some(at(i))), "point {k}");
    }
    assert!(
        s.allocated_bytes() < 3600 * 8,
        "{} bytes",
        s.allocated_bytes()
    );
    // The newest n decode as the tail of all of them, from any offset in a chunk.
    for n in [0, 1, 119, 120, 121, 300, 3599, 3600, 5000] {
        let tail: Vec<_> = s.newest(n).collect();
        assert_eq!(tail.len(), n.min(3600), "n={n}");
        assert_eq!(s.newest(n).len(), n.min(3600));
        assert_eq!(tail[..], all[3600 - n.min(3600)..], "n={n}");
    }
}

#[test]
fn times_anywhere_in_the_protocols_range_come_back_exact() {
    let mut s = SessionSeries::new(8);
    let (now, day) = (1_763_700_000.0, 86_400.0);
    // Far ahead, then back, then months later: no offset range to fall out of.
    let times = [
        now + 30.0 * day,
        now,
        now + 1.5,
        now - 60.0 * day,
        now + 400.0 * day,
    ];
    for (i, t) in times.iter().enumerate() {
        s.push(*t, pt(Some(i as u64), true, [None; 3]));
    }
    let got: Vec<f64> = s.iter().map(|p| p.ts).collect();
    assert_eq!(got, times);
}

/// Through the session store: samples stamped far from their arrival (a wrong clock, a
/// hostile client) go into the history at their arrival and are counted; samples resent
/// minutes late, and those a little ahead, keep their own time.
#[test]
fn sessions_take_untrusted_times_at_their_arrival() {
    use crate::core::jobs::Jobs;
    use crate::core::store::sessions::{SessionLimits, Sessions};
    use crate::core::trainer::Peer;
    use crate::core::trainer::{Hello, Sample, Stats};

    let (t0, day) = (1_763_700_000.0, 86_400.0);
    let mut s = Sessions::new(SessionLimits::default());
    let mut jobs = Jobs::default();
    let peer = Peer {
        pid: 1,
        uid: 0,
        gid: 0,
    };
    let (key, _) = s.open(&mut jobs, peer, Hello::default(), t0);
    let sample = |ts: f64, step: u64| Sample {
        ts,
        step: Some(step),
        phase: "train".into(),
        stats: Stats::default(),
        device_free: None,
        device_total: None,
        alloc_limit: None,
        categories: None,
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
fn any_byte_count_and_step_round_trip_with_absent_values_kept_apart() {
    let mut s = SessionSeries::new(4);
    let cases = [
        pt(Some(u64::MAX), true, [Some(u64::MAX), None, Some(0)]),
        pt(Some(0), false, [Some(0), Some(u64::MAX), None]),
        pt(None, true, [None, Some(u64::MAX), Some(u64::MAX)]),
        pt(Some(5), true, [Some(1), Some(1), Some(1)]),
    ];
    for (i, p) in cases.iter().enumerate() {
        s.push(1e9 + i as f64, *p);
    }
    let back: Vec<_> = s.iter().filter_map(|p| p.value).collect();
    assert_eq!(back, cases);
}
