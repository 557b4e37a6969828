use super::*;

#[test]
fn reads_the_protocol_shape_and_unknown_patterns() {
    let e: Explanation = serde_json::from_str(
        r#"{"pattern":"fragmentation","request_bytes":1610612736,"limit_bytes":4294967296,
            "allocated_bytes":1389363200,"reserved_free_bytes":2454716416,
            "largest_free_block_bytes":13631488,"history":true,
            "failing_site":{"file":"/p/oomlib.py","line":37,"function":"dev_big"},
            "live_sites":[{"file":"/p/oomlib.py","line":32,"function":"dev_pin",
                           "bytes":1321205760,"blocks":180}],
            "reasons":["r"],"remedies":["m"],"message":"fragmentation: ..."}"#,
    )
    .unwrap();
    assert_eq!(e.pattern, Pattern::Fragmentation);
    assert_eq!(e.failing_site.as_ref().unwrap().short(), "oomlib.py:37");
    let top = e.top_live().unwrap();
    assert!((e.live_share(top) - 1321205760.0 / 1389363200.0).abs() < 1e-9);
    let later: Explanation = serde_json::from_str(r#"{"pattern":"thrash"}"#).unwrap();
    assert_eq!(later.pattern, Pattern::Unknown);
}
