use super::*;

const MIB: u64 = 1 << 20;

/// The kept-outputs fixture's numbers (120 MiB at train.py:27 over steps 60–180), with a
/// second, smaller site so shares are not all 100%.
fn kept_outputs() -> Attribution {
    let mut a = crate::core::detect::attribution::kept_outputs_example();
    a.total_growth_bytes = 129 * MIB;
    a.sites.push(Site {
        file: "/home/alice/proj/data.py".into(),
        line: 9,
        function: String::new(),
        bytes: 9 * MIB,
        blocks: 3,
        stack: vec![],
        note: None,
    });
    a
}

#[test]
fn a_summary_names_the_top_site_its_share_and_the_window() {
    let a = kept_outputs();
    assert_eq!(
        summary(&a),
        "train.py:27 in kept_outputs (93% of 129.0 MiB in steps 60\u{2013}180)"
    );
    assert_eq!(site(&a.sites[1]), "data.py:9");
    assert_eq!(site_path(&a.sites[1]), "/home/alice/proj/data.py:9");
    let mut no_steps = a.clone();
    no_steps.step_from = None;
    assert!(summary(&no_steps).ends_with("of 129.0 MiB in 61 s)"));
    no_steps.seconds = None;
    assert!(summary(&no_steps).ends_with("(93% of 129.0 MiB)"));
    let mut none = a.clone();
    none.sites.clear();
    assert_eq!(
        summary(&none),
        "no allocation site grew in steps 60\u{2013}180"
    );
}

#[test]
fn an_error_answer_is_said_with_its_detail() {
    let mut a = kept_outputs();
    a.sites.clear();
    a.error = Some("cut_short".into());
    assert_eq!(summary(&a), "attribution cut short");
    a.error = Some("unavailable".into());
    a.detail = Some("torch.cuda is not available".into());
    assert_eq!(
        summary(&a),
        "attribution unavailable: torch.cuda is not available"
    );
}

#[test]
fn stacks_start_at_the_site_and_say_what_was_cut() {
    let a = kept_outputs();
    let top = &a.sites[0];
    assert_eq!(callers(top), &top.stack[1..]);
    assert_eq!(frame_short(&top.stack[1]), "train.py:48 in run");
    assert_eq!(
        stack(top, 8),
        [
            "/home/alice/proj/train.py:27 in kept_outputs",
            "/home/alice/proj/train.py:48 in run",
            "/home/alice/proj/train.py:69 in <module>",
        ]
    );
    assert_eq!(
        stack(top, 2),
        [
            "/home/alice/proj/train.py:27 in kept_outputs",
            "\u{2026} 2 more frames"
        ]
    );
    // Frames inside torch before the site are not its callers.
    let mut inner = top.clone();
    let relu = Frame {
        file: "/home/alice/.venv/torch/nn/functional.py".into(),
        line: 1723,
        function: "relu".into(),
    };
    inner.stack.insert(0, relu);
    assert_eq!(callers(&inner), &top.stack[1..]);
    // A stack without the site's frame (or none at all) is all callers.
    assert!(callers(&a.sites[1]).is_empty());
    assert_eq!(stack(&a.sites[1], 8), ["/home/alice/proj/data.py:9"]);
    assert_eq!(percent(0.004), "<1%");
    assert_eq!(percent(0.0), "0%");
    assert_eq!(percent(1.0), "100%");
}
