use super::*;

fn explanation(pattern: Pattern, file: &str) -> Explanation {
    let mut x: Explanation = serde_json::from_str(include_str!(
        "../../../../../../../tests/fixtures/oom/fragmentation.json"
    ))
    .unwrap();
    x.pattern = pattern;
    x.live_sites[0].file = file.into();
    x
}

#[test]
fn newest_first_bounded_and_only_the_newest_keeps_its_explanation() {
    let mut o = Ooms::default();
    o.push(1.0, Some(10), Some(7), None);
    assert_eq!(o.went_on(Some(11)), 1);
    assert_eq!(o.went_on(Some(12)), 0, "each counts once");
    for i in 0..6u64 {
        let x = explanation(Pattern::Pressure, &format!("/p/f{i}.py"));
        o.push(2.0 + i as f64, Some(20 + i), None, Some(&x));
    }
    assert_eq!(o.ooms.len(), KEPT);
    assert_eq!(o.ooms_omitted, 3);
    let steps: Vec<_> = o.ooms.iter().map(|r| r.step).collect();
    assert_eq!(steps, [Some(25), Some(24), Some(23), Some(22)]);
    assert!(o.ooms[0].explanation.is_some());
    assert!(o.ooms.iter().skip(1).all(|r| r.explanation.is_none()));
    let newest = &o.ooms[0];
    assert_eq!(newest.pattern, Some(Pattern::Pressure));
    assert_eq!(newest.failing_site.as_deref(), Some("oomlib.py:37"));
    assert_eq!(newest.top_live_site.as_deref(), Some("f5.py:32"));
    assert_eq!(newest.top_live_bytes, Some(1_321_205_760));
    assert_eq!(newest.request_bytes, Some(1_610_612_736));
    assert!(o.ooms.iter().all(|r| !r.survived));
    // One sample after all of them: all went on, the omitted ones counted too.
    assert_eq!(o.went_on(Some(30)), 6);
    assert!(o
        .ooms
        .iter()
        .all(|r| r.survived && r.survived_step == Some(30)));
    // Without an explanation: the event's size, no pattern.
    o.push(9.0, Some(31), Some(384 << 20), None);
    assert_eq!(
        (o.ooms[0].pattern, o.ooms[0].request_bytes),
        (None, Some(384 << 20))
    );
    assert!(o.ooms.iter().all(|r| r.explanation.is_none()));
    let v = serde_json::to_value(&o).unwrap();
    assert_eq!(v["ooms_omitted"], 4);
    assert_eq!(v["ooms"][1]["pattern"], "pressure");
    assert_eq!(v["ooms"][0]["pattern"], serde_json::Value::Null);
}

#[test]
fn counts_by_pattern_with_unexplained_ones_as_unknown() {
    let mut c = OomCounts::default();
    c.event(None);
    c.event(Some(&explanation(Pattern::Fragmentation, "a.py")));
    c.event(Some(&explanation(Pattern::Fragmentation, "a.py")));
    c.event(Some(&explanation(Pattern::None, "a.py")));
    let got: Vec<_> = c.by_pattern().map(|(p, n)| (p.as_str(), n)).collect();
    assert_eq!(
        got,
        [
            ("pressure", 0),
            ("fragmentation", 2),
            ("leak", 0),
            ("unknown", 2)
        ]
    );
}
