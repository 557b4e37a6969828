use super::*;
use crate::core::detect::peak::attention_example;

#[test]
fn a_peak_reads_as_its_top_site_or_its_error() {
    let mut p = attention_example();
    assert_eq!(
        summary(&p),
        "model.py:88 in attention (50% of the 4.0 GiB peak in steps 1,210\u{2013}1,230)"
    );
    p.sites.clear();
    p.step_to = None;
    assert_eq!(
        summary(&p),
        "no allocation site in the trainer's code at the 4.0 GiB peak"
    );
    p.error = Some("failed".into());
    p.detail = Some("snapshot raised".into());
    assert_eq!(summary(&p), "step peak failed: snapshot raised");
}
