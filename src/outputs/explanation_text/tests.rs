use super::*;

fn fragmentation() -> Explanation {
    serde_json::from_str(include_str!(
        "../../../tests/fixtures/oom/fragmentation.json"
    ))
    .unwrap()
}

#[test]
fn the_real_fragmentation_oom_in_words() {
    let x = fragmentation();
    assert_eq!(
        failing(&x).as_deref(),
        Some("/home/alice/proj/oomlib.py:37 in dev_big")
    );
    assert_eq!(
        top_live(&x).as_deref(),
        Some("/home/alice/proj/oomlib.py:32 in dev_pin: 1.2 GiB, 95% of live memory")
    );
    assert_eq!(lines_unknown(&x), None);
    let r = report(&x);
    assert_eq!(r[0], "explanation: fragmentation");
    assert_eq!(r[1], "failed at /home/alice/proj/oomlib.py:37 in dev_big");
    assert_eq!(
        r[2],
        "  called from /home/alice/proj/snap_oom.py:71 in fragmentation"
    );
    assert!(r[3].starts_with("reason: 2.3 GiB of the cache was free"));
    assert_eq!(r[4], "live at the OOM:");
    assert_eq!(
        r[5],
        "   95%    1.2 GiB    180 blocks  /home/alice/proj/oomlib.py:32 in dev_pin"
    );
    assert!(r[6].starts_with("remedy: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
    assert_eq!(r.len(), 8);
}

#[test]
fn without_history_the_lines_are_said_unknown() {
    let mut x = fragmentation();
    x.history = false;
    x.failing_site = None;
    x.live_sites.clear();
    assert_eq!((failing(&x), top_live(&x)), (None, None));
    assert!(report(&x)
        .iter()
        .any(|l| l.contains("history was not recording")));
}
