use super::*;

fn site(file: &str, bytes: u64) -> Site {
    Site {
        file: file.into(),
        line: 27,
        function: "kept_outputs".into(),
        bytes,
        blocks: 1,
        stack: vec![],
        note: None,
    }
}

#[test]
fn shares_use_the_larger_of_total_and_sum() {
    let mut a = Attribution {
        id: 1,
        ts: 0.0,
        finding: None,
        step_from: Some(60),
        step_to: Some(180),
        seconds: None,
        total_growth_bytes: 100,
        sites: vec![site("/home/a/train.py", 93), site("x.py", 7)],
        error: None,
        detail: None,
    };
    assert!((a.share(&a.sites[0]) - 0.93).abs() < 1e-12);
    a.total_growth_bytes = 50;
    assert!((a.share(&a.sites[0]) - 0.93).abs() < 1e-12);
    assert_eq!(a.top().map(Site::short).as_deref(), Some("train.py:27"));
    assert_eq!(site("train.py", 1).short(), "train.py:27");
}
