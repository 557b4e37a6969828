use super::*;

use crate::core::detect::pos_at as at;

#[test]
fn one_noisy_sample_neither_raises_nor_clears() {
    let mut l = Lifecycle::new(Span::samples(3), Span::samples(3));
    let seq = [
        true, false, true, true, true, false, true, false, false, false,
    ];
    let got: Vec<Change> = seq
        .iter()
        .enumerate()
        .map(|(i, a)| l.step(*a, at(i as u64, i as f64)))
        .collect();
    use Change::*;
    assert_eq!(
        got,
        [Pending, Dropped, Pending, Pending, Fired, Firing, Firing, Firing, Firing, Resolved]
    );
}
