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
mod tests;
