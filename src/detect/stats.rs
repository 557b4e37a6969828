//! Robust trend statistics for short series (at most a few dozen points): the Mann–Kendall rank
//! test (tie-corrected) for "is it rising", the Theil–Sen estimator for "how fast". Both ignore
//! how far a point is off, only its order, so one spike or one dip cannot make or break a trend.

/// One-sided Mann–Kendall test for an increasing trend. Returns (S, p-value).
pub fn mann_kendall(y: &[f64]) -> (i64, f64) {
    let n = y.len();
    if n < 3 {
        return (0, 1.0);
    }
    let mut s: i64 = 0;
    for i in 0..n {
        for j in i + 1..n {
            s += match y[j].partial_cmp(&y[i]) {
                Some(std::cmp::Ordering::Greater) => 1,
                Some(std::cmp::Ordering::Less) => -1,
                _ => 0,
            };
        }
    }
    // Variance with the correction for tied groups (exactly flat floors are common).
    let mut sorted: Vec<f64> = y.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mut ties = 0.0;
    let mut run = 1usize;
    for k in 1..=n {
        if k < n && sorted[k] == sorted[k - 1] {
            run += 1;
        } else {
            if run > 1 {
                let t = run as f64;
                ties += t * (t - 1.0) * (2.0 * t + 5.0);
            }
            run = 1;
        }
    }
    let nf = n as f64;
    let var = (nf * (nf - 1.0) * (2.0 * nf + 5.0) - ties) / 18.0;
    if var <= 0.0 || s <= 0 {
        return (s, 1.0);
    }
    // Continuity correction, then the normal upper tail.
    let z = (s as f64 - 1.0) / var.sqrt();
    (s, normal_upper_tail(z))
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

    #[test]
    fn theil_sen_ignores_an_outlier() {
        let x: Vec<f64> = (0..11).map(f64::from).collect();
        let mut y: Vec<f64> = x.iter().map(|v| 2.0 * v + 1.0).collect();
        y[5] = 1e9;
        assert_eq!(theil_sen(&x, &y), Some(2.0));
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
