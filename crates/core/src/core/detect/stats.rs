//! Robust trend statistics for short series (at most a few dozen points): the Mann–Kendall rank
//! test (tie-corrected) for "is it rising", the Theil–Sen estimator for "how fast". Both ignore
//! how far a point is off, only its order, so one spike or one dip cannot make or break a trend.

/// One-sided Mann–Kendall test for an increasing trend. Returns (S, p-value).
pub fn mann_kendall(y: &[f64]) -> (i64, f64) {
    let mut mk = RunningMk::default();
    for (i, v) in y.iter().enumerate() {
        mk.add(y[..i].iter().copied(), *v);
    }
    (mk.s, mk.p(y.len()))
}

/// Mann–Kendall's S and its tie correction over a window that slides, kept as points join and
/// leave: O(n) per change instead of the O(n²) of counting every pair at every test (the leak
/// detector tests a window each time a segment closes, for every busy trainer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunningMk {
    s: i64,
    /// Σ t(t−1)(2t+5) over groups of t equal values (exactly flat floors are common).
    ties: i64,
}

/// One group's share of the tie term.
fn tie_term(t: i64) -> i64 {
    t * (t - 1) * (2 * t + 5)
}

fn sign(later: f64, earlier: f64) -> i64 {
    match later.partial_cmp(&earlier) {
        Some(std::cmp::Ordering::Greater) => 1,
        Some(std::cmp::Ordering::Less) => -1,
        _ => 0,
    }
}

impl RunningMk {
    /// `y` joins the window after the points of `window`.
    pub fn add(&mut self, window: impl Iterator<Item = f64>, y: f64) {
        let mut equal = 0;
        for w in window {
            self.s += sign(y, w);
            equal += i64::from(w == y);
        }
        self.ties += tie_term(equal + 1) - tie_term(equal);
    }

    /// `y`, the oldest point, leaves the window; `rest` is what stays.
    pub fn remove(&mut self, rest: impl Iterator<Item = f64>, y: f64) {
        let mut equal = 0;
        for w in rest {
            self.s -= sign(w, y);
            equal += i64::from(w == y);
        }
        self.ties -= tie_term(equal + 1) - tie_term(equal);
    }

    /// The one-sided p-value of an increasing trend over the `n` points held.
    pub fn p(&self, n: usize) -> f64 {
        if n < 3 || self.s <= 0 {
            return 1.0;
        }
        let nf = n as f64;
        let var = (nf * (nf - 1.0) * (2.0 * nf + 5.0) - self.ties as f64) / 18.0;
        if var <= 0.0 {
            return 1.0;
        }
        // Continuity correction, then the normal upper tail.
        normal_upper_tail((self.s as f64 - 1.0) / var.sqrt())
    }
}

/// P(Z > z) for a standard normal, via erfc (Numerical Recipes' Chebyshev fit, |error| < 1.2e-7).
pub fn normal_upper_tail(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Theil–Sen slope: the median of the pairwise slopes.
pub fn theil_sen(x: &[f64], y: &[f64]) -> Option<f64> {
    let n = x.len().min(y.len());
    let mut slopes = Vec::with_capacity(n * n.saturating_sub(1) / 2);
    for i in 0..n {
        for j in i + 1..n {
            let dx = x[j] - x[i];
            if dx != 0.0 {
                slopes.push((y[j] - y[i]) / dx);
            }
        }
    }
    median(&mut slopes)
}

/// Slope of the lower envelope of points that scatter only upwards from a line, as a floor with
/// whatever happens to be alive on top of it does: the edge of their lower convex hull above the
/// mean x, which is the line under every point that lies highest there. Where the scatter is
/// one-sided this is far tighter than Theil–Sen, whose line runs through the middle of it; on an
/// exact line or a staircase the two agree. Points far below the rest (under Q1 − 3·IQR of the
/// residuals from the Theil–Sen line: a dip, or a flat stretch before the rise began) are left
/// out first, so one low point cannot tilt the envelope. None with fewer than two points left.
pub fn lower_envelope_slope(x: &[f64], y: &[f64]) -> Option<f64> {
    let n = x.len().min(y.len());
    let b = theil_sen(&x[..n], &y[..n])?;
    let mut r: Vec<f64> = (0..n).map(|i| y[i] - b * x[i]).collect();
    r.sort_by(|a, b| a.total_cmp(b));
    let quartile = |q: usize| r[(n - 1) * q / 4];
    let fence = quartile(1) - 3.0 * (quartile(3) - quartile(1));
    // Relative to the first point: cross products of raw byte counts and step numbers would
    // lose the low bits that decide collinearity.
    let (x0, y0) = (x[0], y[0]);
    let mut pts: Vec<(f64, f64)> = (0..n)
        .filter(|&i| y[i] - b * x[i] >= fence)
        .map(|i| (x[i] - x0, y[i] - y0))
        .collect();
    pts.sort_by(|p, q| p.0.total_cmp(&q.0).then(p.1.total_cmp(&q.1)));
    pts.dedup_by(|later, kept| later.0 == kept.0);
    let mean_x = pts.iter().map(|p| p.0).sum::<f64>() / pts.len() as f64;
    // Andrew's monotone chain, lower half.
    let mut hull: Vec<(f64, f64)> = Vec::with_capacity(pts.len());
    for p in pts {
        while let [.., a, o] = hull[..] {
            if (o.0 - a.0) * (p.1 - a.1) - (o.1 - a.1) * (p.0 - a.0) > 0.0 {
                break;
            }
            hull.pop();
        }
        hull.push(p);
    }
    hull.windows(2)
        .find(|w| w[0].0 <= mean_x && mean_x <= w[1].0)
        .map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0))
}

pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mid = v.len() / 2;
    let (_, m, _) = v.select_nth_unstable_by(mid, |a, b| a.total_cmp(b));
    let m = *m;
    if v.len() % 2 == 1 {
        Some(m)
    } else {
        let lower = v[..mid].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((lower + m) / 2.0)
    }
}

#[cfg(test)]
mod tests {
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
}
