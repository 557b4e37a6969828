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
    let fit = t.fit(Some(limit), None).expect("fit");
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
    let fit = t.fit(Some(limit), Some(GIB + 512 * MIB)).expect("fit");
    assert_eq!(fit.largest_safe_batch, 14);
}

#[test]
fn no_batch_fits_when_what_does_not_scale_fills_the_limit() {
    let mut t = Tracker::default();
    t.take(split(Some(16), 4 * GIB), 1.0, peak(9 * GIB));
    let fit = t.fit(Some(4 * GIB), None).expect("fit");
    assert_eq!(fit.largest_safe_batch, 0);
    let e = t.evidence(Some(4 * GIB), None, None).expect("evidence");
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
    // one point 1% off the line.
    for (b, ts) in [(8u64, 1.0), (12, 2.0), (16, 3.0)] {
        let mut act = 512 * MIB + b * 256 * MIB;
        if b == 12 {
            act += act / 100;
        }
        t.take(split(Some(b), act), ts, peak(4 * GIB + act + GIB));
    }
    let fit = t.fit(Some(12 * GIB), None).expect("fit");
    assert_eq!(fit.basis, FitBasis::Fitted);
    assert_eq!(fit.batch_sizes, vec![8, 12, 16]);
    let err = fit.max_error_ratio.expect("error");
    assert!(err > 0.003 && err < 0.01, "{err}");
    // Anchored at batch 16: its peak predicted as measured (to the fit's rounding).
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
    let guess = one.fit(Some(12 * GIB), None).expect("fit");
    assert!(guess.bytes_per_sample > fit.bytes_per_sample);
    assert!(guess.largest_safe_batch <= fit.largest_safe_batch);
    let text = remedies_text(&t.evidence(Some(12 * GIB), None, None).expect("e"));
    assert!(
        text.contains("fitted on batches 8, 12 and 16, within 1%"),
        "{text}"
    );
}

#[test]
fn unknown_batch_or_activations_give_no_batch_but_keep_the_split() {
    let mut t = Tracker::default();
    t.take(split(None, 4 * GIB), 1.0, peak(9 * GIB));
    assert!(t.fit(Some(20 * GIB), None).is_none());
    let mut c = split(Some(16), 0);
    c.partial = vec!["no_grad_forward: nothing saved".into()];
    t.take(c, 2.0, peak(9 * GIB));
    assert!(t.fit(Some(20 * GIB), None).is_none());
    let e = t.evidence(Some(20 * GIB), None, Some(8)).expect("evidence");
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
    assert_eq!(t.points.first(), Some(&(25, 25 * MIB)));
}

#[test]
fn remedies_are_sized_from_the_split() {
    let mut t = Tracker::default();
    t.take(split(Some(16), 4 * GIB), 1.0, peak(9 * GIB));
    let e = t.evidence(Some(10 * GIB), None, Some(8)).expect("evidence");
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
        "a batch of up to 17 fits (now 16; activations and temporaries scaled from batch 16 in proportion); \
         activation checkpointing frees up to 4.0 GiB; bf16 parameters and gradients free 1.0 GiB (half their \
         float32 bytes); sharding the optimizer state over the job's 8 ranks (ZeRO-1, FSDP) frees 1.8 GiB"
    );
    assert_eq!(
        split_text(&e.split),
        "parameters 1.0 GiB, gradients 1.0 GiB, optimizer state 2.0 GiB, activations 4.0 GiB, other 1.0 GiB (step 3, batch 16)"
    );
    // One rank, or state sharded already: no sharding remedy. No fp32 figure: no bf16 one.
    let one = t.evidence(Some(10 * GIB), None, Some(1)).expect("e");
    assert_eq!(one.remedies.sharding, None);
    let mut c = split(Some(16), 4 * GIB);
    c.partial = vec!["dtensor_local: local shards counted".into()];
    c.fp32_bytes = None;
    t.take(c, 2.0, peak(9 * GIB));
    let e = t.evidence(Some(8 * GIB), None, Some(8)).expect("e");
    assert_eq!(e.remedies.sharding, None);
    assert_eq!(e.remedies.bf16_bytes, None);
    // DeepSpeed ZeRO-1/2 (gradients in its own buffers) partitions the state already.
    let mut c = split(Some(16), 4 * GIB);
    c.partial = vec!["gradients_elsewhere: 12 parameters require grad".into()];
    t.take(c, 3.0, peak(9 * GIB));
    let z = t.evidence(Some(8 * GIB), None, Some(8)).expect("e");
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
    assert_eq!(t.points, vec![(16, 4 * GIB)]);
    let fit = t.fit(Some(10 * GIB), None).expect("fit");
    assert_eq!(fit.basis, FitBasis::Proportional);
    // 4 GiB of activations and 1 GiB of temporaries per 16 samples, not the latest 3 + 0.75.
    assert_eq!(fit.bytes_per_sample, 320 * MIB);
    assert_eq!(fit.fixed_bytes, 4 * GIB);
    assert_eq!(fit.largest_safe_batch, 17);
    // At the batch measured, never less than the latest step's own peak.
    assert!(fit.predict(16) >= 4 * GIB + 3 * GIB + 3 * GIB / 4);
}
