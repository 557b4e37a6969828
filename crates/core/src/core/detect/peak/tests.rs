use super::*;

#[test]
fn shares_are_of_the_peak_or_the_sites_sum() {
    let mut p = attention_example();
    assert!((p.share(&p.sites[0]) - 0.5).abs() < 1e-12);
    // A total below what the sites hold: shares stay within 1.
    p.peak_bytes = 1;
    assert!((p.share(&p.sites[0]) - 2.0 / 3.0).abs() < 1e-12);
    p.sites.clear();
    assert!(p.top().is_none());
    let empty = Peak {
        peak_bytes: 0,
        ..attention_example()
    };
    assert_eq!(empty.share(&attention_example().sites[0]), 2.0 / 3.0);
}
