use super::*;

#[test]
fn mann_kendall_sees_a_noisy_rise_and_not_noise() {
    let rise: Vec<f64> = (0..20)
        .map(|i| i as f64 + if i % 3 == 0 { 2.5 } else { 0.0 })
        .collect();
    let (s, p) = mann_kendall(&rise);
    assert!(s > 100 && p < 1e-5, "s={s} p={p}");
    // Digits of pi from the 30th: no trend.
    let noise = [
        9., 2., 6., 5., 3., 5., 8., 9., 7., 9., 3., 2., 3., 8., 4., 6., 2., 6., 4., 3.,
    ];
    assert!(mann_kendall(&noise).1 > 0.05);
    let flat = vec![5.0; 20];
    assert_eq!(mann_kendall(&flat), (0, 1.0));
}

/// S and the tie term counted the long way: every pair, and runs of a sorted copy.
fn mk_by_pairs(y: &[f64]) -> RunningMk {
    let mut s = 0;
    for i in 0..y.len() {
        for j in i + 1..y.len() {
            s += sign(y[j], y[i]);
        }
    }
    let mut sorted = y.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut ties = 0;
    for run in sorted.chunk_by(|a, b| a == b) {
        ties += tie_term(run.len() as i64);
    }
    RunningMk { s, ties }
}

/// A window of 32 sliding over 600 values drawn from 12 levels (so ties come and go, and
/// rises and falls both): what is kept as points join and leave equals the full count at
/// every step, and so does the p-value.
#[test]
fn the_running_mann_kendall_equals_counting_every_pair() {
    let y: Vec<f64> = (0..600)
        .map(|i| (unit(i, 7) * 12.0).floor() + (i / 150) as f64 * 3.0)
        .collect();
    let mut mk = RunningMk::default();
    let mut window: std::collections::VecDeque<f64> = Default::default();
    let mut significant = 0;
    for &v in &y {
        if window.len() == 32 {
            let old = window.pop_front().unwrap();
            mk.remove(window.iter().copied(), old);
        }
        mk.add(window.iter().copied(), v);
        window.push_back(v);
        let w: Vec<f64> = window.iter().copied().collect();
        let full = mk_by_pairs(&w);
        assert_eq!(mk, full, "window {w:?}");
        assert_eq!(mk.p(w.len()), full.p(w.len()));
        significant += usize::from(mk.p(w.len()) < 0.05);
    }
    // The steps between quarters make some windows rise: the test compared real verdicts.
    assert!(significant > 10, "{significant}");
}

#[test]
fn theil_sen_ignores_an_outlier() {
    let x: Vec<f64> = (0..11).map(f64::from).collect();
    let mut y: Vec<f64> = x.iter().map(|v| 2.0 * v + 1.0).collect();
    y[5] = 1e9;
    assert_eq!(theil_sen(&x, &y), Some(2.0));
}

/// Deterministic pseudo-random numbers in [0, 1).
fn unit(i: u64, seed: u64) -> f64 {
    let mut x = (i ^ (seed << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x % 1_000_000) as f64 / 1_000_000.0
}

/// A floor rising 2 MiB/step, one point per 16 steps, with 100 to 400 MiB on top, mostly
/// little (a variable-length batch's outputs): over 40 draws the envelope finds the rate
/// within 3%, where the median line through the scatter is off by over 10% on some.
#[test]
fn the_lower_envelope_finds_a_floor_under_one_sided_scatter() {
    let mib = 1048576.0;
    let mut worst_envelope: f64 = 0.0;
    let mut worst_theil_sen: f64 = 0.0;
    for seed in 0..40 {
        let x: Vec<f64> = (0..24).map(|i| 256.0 + 16.0 * i as f64).collect();
        let y: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let u = unit(i as u64, seed);
                20e9 + 2.0 * mib * s + 100.0 * mib + 300.0 * mib * u * u * u
            })
            .collect();
        let e = lower_envelope_slope(&x, &y).unwrap() / (2.0 * mib);
        let t = theil_sen(&x, &y).unwrap() / (2.0 * mib);
        worst_envelope = worst_envelope.max((e - 1.0).abs());
        worst_theil_sen = worst_theil_sen.max((t - 1.0).abs());
    }
    assert!(worst_envelope < 0.03, "envelope off by {worst_envelope}");
    assert!(worst_theil_sen > 0.1, "Theil–Sen off by {worst_theil_sen}");
}

#[test]
fn the_lower_envelope_of_a_line_or_a_staircase_is_its_rate() {
    let x: Vec<f64> = (0..30).map(|i| 100.0 + 8.0 * i as f64).collect();
    let line: Vec<f64> = x.iter().map(|s| 3e9 + 1000.0 * s).collect();
    let b = lower_envelope_slope(&x, &line).unwrap();
    assert!((b - 1000.0).abs() < 1e-6, "{b}");
    // 64 MiB every 40 steps, starting at the first point: 64 MiB / 40 a step on average.
    let stairs: Vec<f64> = x
        .iter()
        .map(|s| ((s - 100.0) / 40.0).floor() * 64.0)
        .collect();
    let b = lower_envelope_slope(&x, &stairs).unwrap();
    assert!((b - 64.0 / 40.0).abs() < 1e-9, "{b}");
}

#[test]
fn one_dip_does_not_tilt_the_lower_envelope() {
    let x: Vec<f64> = (0..20).map(f64::from).collect();
    let mut y: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, s)| 10.0 * s + 5.0 * unit(i as u64, 7))
        .collect();
    y[9] -= 500.0;
    let b = lower_envelope_slope(&x, &y).unwrap();
    assert!((b - 10.0).abs() < 0.5, "{b}");
    assert_eq!(lower_envelope_slope(&[1.0], &[2.0]), None);
    assert_eq!(lower_envelope_slope(&[1.0, 1.0], &[2.0, 3.0]), None);
}

#[test]
fn normal_tail_matches_known_values() {
    assert!((normal_upper_tail(0.0) - 0.5).abs() < 1e-7);
    assert!((normal_upper_tail(1.959_964) - 0.025).abs() < 1e-6);
    assert!((normal_upper_tail(-1.0) - 0.841_344_7).abs() < 1e-6);
}

#[test]
fn median_of_even_and_odd() {
    assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    assert_eq!(median(&mut []), None);
}
