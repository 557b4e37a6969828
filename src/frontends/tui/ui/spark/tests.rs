use super::*;

#[test]
fn buckets_keep_real_gaps_and_bridge_jitter() {
    // 10 buckets over 300 s: 30 s each. Points at 1 s for the last 100 s, one real gap.
    let now = 1000.0;
    let pts: Vec<(f64, Option<u64>)> = (0..100)
        .map(|i| {
            let ts = now - 99.0 + i as f64;
            (ts, if i == 50 { None } else { Some(i as u64) })
        })
        .collect();
    let b = buckets(pts.into_iter(), now, 10);
    assert_eq!(b.len(), 4, "only buckets since the first point: {b:?}");
    assert_eq!(b.last(), Some(&Some(99)));
    // Sparse points (one every 3 buckets) leave no false gaps.
    let pts = [
        (now - 250.0, Some(5)),
        (now - 100.0, Some(7)),
        (now, Some(9)),
    ];
    let b = buckets(pts.into_iter(), now, 30);
    assert!(b.iter().all(|v| v.is_some()), "{b:?}");
    // An explicit None is shown.
    let pts = [(now - 20.0, Some(5)), (now - 10.0, None), (now, Some(9))];
    let b = buckets(pts.into_iter(), now, 300);
    assert!(b.contains(&None), "{b:?}");
}
