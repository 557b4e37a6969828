use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The example model (`example`: 4 GiB that do not scale) with these activations; the tests
/// below put its step peak at 9 GiB with 4 GiB of activations: 1 GiB of temporaries.
fn split(batch: Option<u64>, activations: u64) -> Categories {
    example(batch, activations)
}

fn peak(bytes: u64) -> Option<u64> {
    Some(bytes)
}

/// A limit with no cap, and the allocator's split blocks.
fn at(limit: u64, inactive_split: Option<u64>) -> Budget {
    Budget {
        limit: Some(limit),
        cap: None,
        inactive_split,
    }
}

#[test]
fn other_is_the_peak_less_everything_named_and_unknown_without_a_peak() {
    let mut t = Tracker::default();
    t.take(split(Some(16), 4 * GIB), 1.0, peak(9 * GIB));
    let s = t.latest().expect("split");
    assert_eq!(s.other_bytes, Some(GIB));
    assert_eq!(s.peak_bytes, Some(9 * GIB));
    t.take(split(Some(16), 4 * GIB), 2.0, None);
    assert_eq!(t.latest().expect("split").other_bytes, None);
    assert_eq!(t.measured, 2);
    // A peak below what is named (gradients freed before the forward's peak) is no negative.
    t.take(split(Some(16), 4 * GIB), 3.0, peak(7 * GIB));
    assert_eq!(t.latest().expect("split").other_bytes, Some(0));
}

#[test]
fn with_one_batch_size_activations_and_temporaries_scale_in_proportion() {
    let mut t = Tracker::default();
    t.take(split(Some(16), 4 * GIB), 1.0, peak(9 * GIB));
    // 5 GiB scale with 16 samples: 320 MiB a sample; 4 GiB do not.
    let limit = 10 * GIB;
    let fit = t.fit(at(limit, None)).expect("fit");
    assert_eq!(fit.basis, FitBasis::Proportional);
    assert_eq!(fit.bytes_per_sample, 320 * MIB);
    assert_eq!(fit.fixed_bytes, 4 * GIB);
    assert_eq!(fit.predict(16), 9 * GIB);
    // Margin: a twentieth of 10 GiB = 512 MiB; (10 GiB − 512 MiB − 4 GiB) / 320 MiB = 17.6.
    assert_eq!(fit.margin_bytes, 512 * MIB);
    assert_eq!(fit.largest_safe_batch, 17);
    assert!(fit.predict(17) <= limit - fit.margin_bytes);
    assert!(fit.predict(18) > limit - fit.margin_bytes);
    // The allocator's split blocks, when more than the twentieth, are the margin.
    let fit = t.fit(at(limit, Some(GIB + 512 * MIB))).expect("fit");
    assert_eq!(fit.largest_safe_batch, 14);
}

#[test]
fn no_batch_fits_when_what_does_not_scale_fills_the_limit() {
    let mut t = Tracker::default();
    t.take(split(Some(16), 4 * GIB), 1.0, peak(9 * GIB));
    let fit = t.fit(at(4 * GIB, None)).expect("fit");
    assert_eq!(fit.largest_safe_batch, 0);
    let e = t.evidence(at(4 * GIB, None), None).expect("evidence");
    assert!(
        remedies_text(&e).starts_with("no batch fits"),
        "{}",
        remedies_text(&e)
    );
}

#[test]
fn several_batch_sizes_fit_a_line_and_state_its_error() {
    let mut t = Tracker::default();
    // 256 MiB a sample plus 512 MiB that does not scale (a fixed-size attention mask), with
    // one point 1% off the line; temporaries 2/9 of the activations (1 GiB at batch 16).
    for (b, ts) in [(8u64, 1.0), (12, 2.0), (16, 3.0)] {
        let mut act = 512 * MIB + b * 256 * MIB;
        if b == 12 {
            act += act / 100;
        }
        t.take(split(Some(b), act), ts, peak(4 * GIB + act + act / 9 * 2));
    }
    let fit = t.fit(at(12 * GIB, None)).expect("fit");
    assert_eq!(fit.basis, FitBasis::Fitted);
    assert_eq!(fit.batch_sizes, vec![8, 12, 16]);
    let err = fit.max_error_ratio.expect("error");
    assert!(err > 0.003 && err < 0.01, "{err}");
    // Anchored at batch 16: its peak predicted as measured (to the fit's rounding, and batch
    // 12's point above the line lifting it a little).
    let measured = 4 * GIB + 512 * MIB + 16 * 256 * MIB + GIB;
    assert!(
        fit.predict(16).abs_diff(measured) < 64 * MIB,
        "{}",
        fit.predict(16)
    );
    // The proportional guess from batch 16 alone would count the fixed 512 MiB as scaling:
    // fewer samples a GiB than the fit.
    let mut one = Tracker::default();
    one.take(
        split(Some(16), 512 * MIB + 16 * 256 * MIB),
        1.0,
        peak(measured),
    );
    let guess = one.fit(at(12 * GIB, None)).expect("fit");
    assert!(guess.bytes_per_sample > fit.bytes_per_sample);
    assert!(guess.largest_safe_batch <= fit.largest_safe_batch);
    let text = remedies_text(&t.evidence(at(12 * GIB, None), None).expect("e"));
    assert!(
        text.contains("fitted on batches 8, 12 and 16, within 1%"),
        "{text}"
    );
}

#[test]
fn unknown_batch_or_activations_give_no_batch_but_keep_the_split() {
    let mut t = Tracker::default();
    t.take(split(None, 4 * GIB), 1.0, peak(9 * GIB));
    assert!(t.fit(at(20 * GIB, None)).is_none());
    let mut c = split(Some(16), 0);
    c.partial = vec!["no_grad_forward: nothing saved".into()];
    t.take(c, 2.0, peak(9 * GIB));
    assert!(t.fit(at(20 * GIB, None)).is_none());
    let e = t.evidence(at(20 * GIB, None), Some(8)).expect("evidence");
    assert_eq!(e.largest_safe_batch, None);
    assert_eq!(e.remedies.checkpointing_bytes, None);
    assert!(split_text(&e.split).contains("activations not measured"));
    // Neither kind of split teaches the fit anything.
    assert!(t.points.is_empty());
}

#[test]
fn the_fit_keeps_one_point_per_batch_size_and_at_most_sixteen() {
    let mut t = Tracker::default();
    for b in 1..=40u64 {
        t.take(split(Some(b), b * MIB), b as f64, peak(5 * GIB));
        t.take(split(Some(b), b * MIB), b as f64, peak(5 * GIB));
    }
    assert_eq!(t.points.len(), FIT_POINTS);
    assert_eq!(
        t.points.first().map(|p| (p.batch, p.activations)),
        Some((25, 25 * MIB))
    );
}

#[test]
fn remedies_are_sized_from_the_split() {
    let mut t = Tracker::default();
    t.take(split(Some(16), 4 * GIB), 1.0, peak(9 * GIB));
    let e = t.evidence(at(10 * GIB, None), Some(8)).expect("evidence");
    let r = &e.remedies;
    assert_eq!(
        r.batch,
        Some(BatchRemedy {
            current: 16,
            fits: 17
        })
    );
    assert_eq!(r.checkpointing_bytes, Some(4 * GIB));
    assert_eq!(r.bf16_bytes, Some(GIB));
    assert_eq!(
        r.sharding,
        Some(ShardingRemedy {
            ranks: 8,
            frees_bytes: 2 * GIB / 8 * 7
        })
    );
    let text = remedies_text(&e);
    assert_eq!(
        text,
        "a batch of up to 17 fits (now 16; scaled from batch 16); \
         activation checkpointing frees up to 4.0 GiB; bf16 parameters and gradients free 1.0 GiB (half their \
         float32 bytes); sharding the optimizer state over the job's 8 ranks (ZeRO-1, FSDP) frees 1.8 GiB"
    );
    assert_eq!(
        split_text(&e.split),
        "parameters 1.0 GiB, gradients 1.0 GiB, optimizer state 2.0 GiB, activations 4.0 GiB, other 1.0 GiB (step 3, batch 16)"
    );
    // One rank, or state sharded already: no sharding remedy. No fp32 figure: no bf16 one.
    let one = t.evidence(at(10 * GIB, None), Some(1)).expect("e");
    assert_eq!(one.remedies.sharding, None);
    let mut c = split(Some(16), 4 * GIB);
    c.partial = vec!["dtensor_local: local shards counted".into()];
    c.fp32_bytes = None;
    t.take(c, 2.0, peak(9 * GIB));
    let e = t.evidence(at(8 * GIB, None), Some(8)).expect("e");
    assert_eq!(e.remedies.sharding, None);
    assert_eq!(e.remedies.bf16_bytes, None);
    // DeepSpeed ZeRO-1/2 (gradients in its own buffers) partitions the state already.
    let mut c = split(Some(16), 4 * GIB);
    c.partial = vec!["gradients_elsewhere: 12 parameters require grad".into()];
    t.take(c, 3.0, peak(9 * GIB));
    let z = t.evidence(at(8 * GIB, None), Some(8)).expect("e");
    assert_eq!(z.remedies.sharding, None);
    assert!(
        remedies_text(&e).starts_with("a batch of 11 fits (now 16;"),
        "{}",
        remedies_text(&e)
    );
}

#[test]
fn with_variable_sequence_lengths_the_longest_seen_decides() {
    // Batch 16 each time; the sequences of the latest step were shorter than an earlier one's.
    let mut t = Tracker::default();
    for (act, ts) in [(2 * GIB, 1.0), (4 * GIB, 2.0), (3 * GIB, 3.0)] {
        t.take(split(Some(16), act), ts, peak(4 * GIB + act + act / 4));
    }
    assert_eq!(
        t.points,
        vec![Point {
            batch: 16,
            activations: 4 * GIB,
            peak: Some(4 * GIB + 4 * GIB + GIB)
        }]
    );
    let fit = t.fit(at(10 * GIB, None)).expect("fit");
    assert_eq!(fit.basis, FitBasis::Proportional);
    // 4 GiB of activations and 1 GiB of temporaries per 16 samples, not the latest 3 + 0.75.
    assert_eq!(fit.bytes_per_sample, 320 * MIB);
    assert_eq!(fit.fixed_bytes, 4 * GIB);
    assert_eq!(fit.largest_safe_batch, 17);
    // At the batch measured, never less than the latest step's own peak.
    assert!(fit.predict(16) >= 4 * GIB + 3 * GIB + 3 * GIB / 4);
}

#[test]
fn the_fit_never_predicts_under_a_peak_it_measured() {
    // The case: batch 16 measured at a 77 GiB peak (3 GiB of headroom under 80 GiB:
    // near_limit fires), then a short last batch of 8 whose temporaries are a smaller share.
    // A line through the activations, scaled by batch 8's temporaries, runs under batch 16's
    // peak and said "a batch of up to 22 fits".
    let limit = 80 * GIB;
    let mut t = Tracker::new(512 * MIB);
    let mut c16 = split(Some(16), 32 * GIB);
    c16.optimizer_state_bytes = 18 * GIB;
    t.take(c16.clone(), 1.0, peak(77 * GIB));
    let mut c8 = c16;
    c8.batch_size = Some(8);
    c8.activations_bytes = 16 * GIB;
    t.take(c8, 2.0, peak(40 * GIB));
    let fit = t.fit(at(limit, None)).expect("fit");
    assert_eq!(fit.basis, FitBasis::Fitted);
    assert!(fit.predict(16) >= 77 * GIB, "{}", fit.predict(16));
    assert!(fit.predict(8) >= 40 * GIB, "{}", fit.predict(8));
    assert!(fit.largest_safe_batch < 16, "{}", fit.largest_safe_batch);
    // What does not scale is in every peak: never more than the lowest measured.
    assert!(fit.fixed_bytes <= 40 * GIB, "{}", fit.fixed_bytes);
}

#[test]
fn a_batch_that_fits_keeps_near_limits_own_margin() {
    // Under a 6 GiB cap near_limit fires under 512 MiB of headroom (less than a tenth of the
    // cap), more than the fit's twentieth (307 MiB): a batch that fits keeps 512 MiB.
    let cap = 6 * GIB;
    let mut t = Tracker::new(512 * MIB);
    t.take(split(Some(16), GIB), 1.0, peak(5 * GIB + 600 * MIB));
    let fit = t
        .fit(Budget {
            limit: Some(cap),
            cap: Some(cap),
            inactive_split: None,
        })
        .expect("fit");
    assert_eq!(fit.margin_bytes, 512 * MIB);
    // 5.6 GiB now at 16 (headroom 424 MiB: near_limit fires): 16 does not fit.
    assert!(fit.largest_safe_batch < 16, "{}", fit.largest_safe_batch);
    // Under a 4 GiB cap near_limit's margin is a tenth of it, and so is the fit's.
    assert_eq!(near_limit_margin(512 * MIB, Some(4 * GIB)), 4 * GIB / 10);
}

#[test]
fn a_two_point_line_states_no_error_and_a_rough_line_is_not_used() {
    // Two batch sizes: the line passes through both; "within 0%" would say nothing.
    let mut t = Tracker::default();
    for (b, ts) in [(8u64, 1.0), (16, 2.0)] {
        let act = 512 * MIB + b * 256 * MIB;
        t.take(split(Some(b), act), ts, peak(4 * GIB + act));
    }
    let text = remedies_text(&t.evidence(at(40 * GIB, None), None).expect("e"));
    assert!(
        text.contains("(now 16; fitted on batches 8 and 16)"),
        "{text}"
    );
    // Activations that do not follow the batch (1 B at batch 2): a line off by orders of
    // magnitude at some size is no fit, and no error figure like "within 36650387592500%".
    let mut t = Tracker::default();
    for (b, act, ts) in [(2u64, 1, 1.0), (3, 20 * GIB, 2.0), (4, 2 * GIB, 3.0)] {
        t.take(split(Some(b), act), ts, peak(4 * GIB + act));
    }
    let fit = t.fit(at(80 * GIB, None)).expect("fit");
    assert_eq!(fit.basis, FitBasis::Proportional);
    assert_eq!(fit.max_error_ratio, None);
    let text = remedies_text(&t.evidence(at(80 * GIB, None), None).expect("e"));
    assert!(!text.contains('%'), "{text}");
    // Still never under a peak it measured (24 GiB at batch 3).
    assert!(fit.predict(3) >= 24 * GIB);
}

#[test]
fn no_remedy_frees_nothing_or_more_than_the_split_holds() {
    let mut t = Tracker::default();
    // 0-byte parameters and gradients (all offloaded): whatever fp32 figure an old trace
    // carries, bf16 frees nothing here.
    let mut c = split(Some(16), 4 * GIB);
    c.parameters_bytes = 0;
    c.gradients_bytes = 0;
    c.fp32_bytes = Some(1 << 50);
    t.take(c, 1.0, peak(9 * GIB));
    let e = t.evidence(at(80 * GIB, None), Some(u64::MAX)).expect("e");
    assert_eq!(e.remedies.bf16_bytes, None);
    // Sharded over 2^64 − 1 ranks, each keeps one byte of the 2 GiB: not "frees 0 B".
    assert_eq!(
        e.remedies.sharding,
        Some(ShardingRemedy {
            ranks: u64::MAX,
            frees_bytes: 2 * GIB - 1
        })
    );
    // One byte of state shards into nothing smaller: no remedy rather than "frees 0 B".
    let mut c = split(Some(16), 4 * GIB);
    c.optimizer_state_bytes = 1;
    t.take(c, 2.0, peak(9 * GIB));
    let e = t.evidence(at(80 * GIB, None), Some(8)).expect("e");
    assert_eq!(e.remedies.sharding, None);
    assert!(!remedies_text(&e).contains(" 0 B"), "{}", remedies_text(&e));
}

#[test]
fn no_batch_fits_says_so_plainly_when_the_fixed_part_is_over_the_limit() {
    let mut t = Tracker::default();
    t.take(split(Some(16), 4 * GIB), 1.0, peak(9 * GIB));
    let e = t.evidence(at(GIB, None), None).expect("e");
    // A batch past what the fit answers (an old trace) gets no batch remedy, not a smaller one.
    let mut big = Tracker::default();
    big.take(split(Some(MAX_BATCH + 1), 4 * GIB), 1.0, peak(9 * GIB));
    assert!(big.fit(at(80 * GIB, None)).is_none());
    let text = remedies_text(&e);
    assert!(
        text.starts_with(
            "no batch fits: what does not scale with it (4.0 GiB) is over the 1.0 GiB the allocator can hold"
        ),
        "{text}"
    );
}

mod props;
