use super::*;

#[test]
fn a_leak_reads_like_the_contract_example() {
    let e = Evidence {
        slope_bytes_per_step: Some(2.0 * 1048576.0),
        onset_step: Some(610),
        growth_bytes: Some(400 << 20),
        // The detector's window is evidence only: the message measures from the onset.
        window_start_step: Some(700),
        window_growth_bytes: Some(150 << 20),
        oom_eta_seconds: Some(15_000.0),
        oom_eta_steps: Some(30_188),
        step: Some(812),
        ..Evidence::default()
    };
    assert_eq!(
        describe(Kind::Leak, &e),
        "allocated floor grows 2.0 MiB/step since step 610 (+400.0 MiB so far); at this rate the GPU is full in ~4h10m (step ~31,000)"
    );
}

#[test]
fn pressure_and_ooms_say_what_lay_outside_the_allocator() {
    let e = Evidence {
        retries: Some(3),
        headroom_bytes: Some(200 << 20),
        outside_allocator_bytes: Some(4_617_089_843),
        ..Evidence::default()
    };
    assert_eq!(
        describe(Kind::NearLimit, &e),
        "the allocator retried cudaMalloc 3 times recently (it had to free its cache to fit); headroom at the step peak is 200.0 MiB; 4.3 GiB of the process's memory is outside PyTorch's allocator"
    );
    let oom = Evidence {
        alloc_bytes: Some(2 << 30),
        device_free: Some(1 << 30),
        step: Some(40_000),
        outside_allocator_bytes: Some(4_617_089_843),
        ..Evidence::default()
    };
    assert_eq!(
        describe(Kind::Oom, &oom),
        "CUDA out of memory: tried to allocate 2.0 GiB with 1.0 GiB free at step 40,000; 4.3 GiB of the process's memory was outside PyTorch's allocator"
    );
    // Nothing outside (or under a MiB): no clause.
    let none = Evidence {
        outside_allocator_bytes: Some(1000),
        ..e
    };
    assert!(!describe(Kind::NearLimit, &none).contains("outside"));
}

fn attribution(sites: Vec<(&str, u64, &str, u64)>) -> Attribution {
    use crate::core::detect::attribution::Site;
    Attribution {
        id: 1,
        ts: 0.0,
        finding: None,
        step_from: Some(610),
        step_to: Some(730),
        seconds: Some(61.2),
        total_growth_bytes: 128 << 20,
        sites: sites
            .into_iter()
            .map(|(file, line, function, bytes)| Site {
                file: file.into(),
                line,
                function: function.into(),
                bytes,
                blocks: 1,
                stack: vec![],
                note: None,
            })
            .collect(),
        error: None,
        detail: None,
    }
}

#[test]
fn attribution_names_the_top_site_with_its_share() {
    let kept = (119 << 20) + (1 << 19);
    let mut a = attribution(vec![
        ("/home/alice/proj/train.py", 27, "kept_outputs", kept),
        ("/home/alice/proj/train.py", 34, "eval_step", 8 << 20),
    ]);
    assert_eq!(
        attributed(&a).as_deref(),
        Some("93% of the growth in steps 610\u{2013}730 was allocated at train.py:27 in kept_outputs")
    );
    // Without steps, the window's length; without either, no window at all.
    (a.step_from, a.step_to) = (None, None);
    assert_eq!(
        attributed(&a).as_deref(),
        Some("93% of the growth in the last 61 s was allocated at train.py:27 in kept_outputs")
    );
    a.seconds = Some(600.0);
    assert!(attributed(&a).unwrap().contains("in the last 10 min was"));
    a.seconds = None;
    assert_eq!(
        attributed(&a).as_deref(),
        Some("93% of the recent growth was allocated at train.py:27 in kept_outputs")
    );
    // Steps that do not make a window fall back the same way.
    (a.step_from, a.step_to) = (Some(12_000), Some(12_000));
    assert!(attributed(&a)
        .unwrap()
        .starts_with("93% of the recent growth"));
    (a.step_from, a.step_to) = (Some(12_000), Some(13_500));
    assert!(attributed(&a)
        .unwrap()
        .contains("in steps 12,000\u{2013}13,500"));
}

#[test]
fn the_peak_names_its_top_site_with_its_share_of_live_memory() {
    let mut p = crate::core::detect::peak::attention_example();
    assert_eq!(
        at_peak(&p).as_deref(),
        Some("at the step peak 50% of live memory (2.0 GiB) was allocated at model.py:88 in attention")
    );
    p.sites[0].function = "<module>".into();
    assert!(at_peak(&p)
        .unwrap()
        .ends_with("model.py:88 at module level"));
    p.error = Some("failed".into());
    assert_eq!(at_peak(&p), None);
    p.error = None;
    p.sites.clear();
    assert_eq!(at_peak(&p), None);
}

#[test]
fn attribution_wording_at_the_edges() {
    let a = attribution(vec![("train.py", 5, "<module>", 1 << 10)]);
    assert_eq!(
        attributed(&a).as_deref(),
        Some(
            "<1% of the growth in steps 610\u{2013}730 was allocated at train.py:5 at module level"
        )
    );
    let a = attribution(vec![("train.py", 5, "", 128 << 20)]);
    assert_eq!(
        attributed(&a).as_deref(),
        Some("100% of the growth in steps 610\u{2013}730 was allocated at train.py:5")
    );
    // Nothing found, or nothing measured: no clause (the error is shown as such elsewhere).
    assert_eq!(attributed(&attribution(vec![])), None);
    let mut a = attribution(vec![("train.py", 27, "kept_outputs", 1 << 20)]);
    a.error = Some("cut_short".into());
    assert_eq!(attributed(&a), None);
}

#[test]
fn formats() {
    assert_eq!(thousands(1234567), "1,234,567");
    assert_eq!(thousands(12), "12");
    assert_eq!(duration_coarse(59.0), "59s");
    assert_eq!(duration_coarse(90_000.0), "1d01h");
    assert_eq!(round_step(31_012), 31_000);
}

#[test]
fn a_leak_without_a_line_says_why() {
    let mut a = attribution(vec![]);
    a.error = Some("unavailable".into());
    a.detail = Some("torch.cuda is not available".into());
    assert_eq!(
        unattributed(&a).as_deref(),
        Some("no line is named: the trainer cannot record allocation history (torch.cuda is not available)")
    );
    a.error = Some("failed".into());
    a.detail = Some("RuntimeError: snapshot".into());
    assert_eq!(
        unattributed(&a).as_deref(),
        Some("no line is named: recording allocation history failed (RuntimeError: snapshot)")
    );
    a.error = Some("cut_short".into());
    assert!(unattributed(&a)
        .unwrap()
        .contains("stopped reporting before"));
    a.error = Some("newer_code".into());
    a.detail = None;
    assert_eq!(
        unattributed(&a).as_deref(),
        Some("no line is named: the trainer could not attribute (newer_code)")
    );
    // Answered, but nothing grew: that is said too, with the window.
    assert_eq!(
        unattributed(&attribution(vec![])).as_deref(),
        Some("no line is named: no allocation site grew in steps 610\u{2013}730")
    );
    // A line named: no such clause.
    let named = attribution(vec![("train.py", 27, "kept_outputs", 1 << 20)]);
    assert_eq!(unattributed(&named), None);
}

#[test]
fn a_peak_past_the_limit_is_over_it_not_a_negative_headroom() {
    // A cap set below what the trainer already held: the peak is 9.90 GiB past it.
    let over = -(9_900 * (1i64 << 30) / 1000);
    let e = Evidence {
        headroom_bytes: Some(over),
        alloc_limit: Some(1),
        ..Evidence::default()
    };
    assert_eq!(
        describe(Kind::NearLimit, &e),
        "the step peak is over the 1 B allowed by 9.90 GiB"
    );
    let e = Evidence {
        headroom_bytes: Some(-(3 << 30)),
        ..Evidence::default()
    };
    assert_eq!(
        describe(Kind::NearLimit, &e),
        "the step peak is over what the allocator can hold by 3.0 GiB"
    );
}
