//! The advice's invariants over everything the wire accepts (protocol/categories.rs: bytes up
//! to 2^50, batch sizes up to 2^24, fp32_bytes within parameters and gradients, any world
//! size): sizes within what was measured, the predicted batch within [0, 2^24], never under a
//! peak measured at a batch seen, and never a batch that fits while near_limit fires.

use proptest::prelude::*;

use super::super::*;
use crate::core::detect::findings::{Findings, Subject};
use crate::core::detect::{DetectConfig, Kind, Obs, SessionDetect};
use crate::core::trainer::{Sample, Stats};

const MAX_BYTES: u64 = 1 << 50;

/// Small figures, where rounding bites, as often as large ones.
fn bytes() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..=4096, 0u64..=MAX_BYTES]
}

fn batch() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=64, 1u64..=MAX_BATCH]
}

/// One measured step: a split with its batch, and its sample's allocator peak.
fn step() -> impl Strategy<Value = (u64, u64, Option<u64>)> {
    (
        batch(),
        prop_oneof![1u64..=4096, 1u64..=MAX_BYTES],
        proptest::option::of(bytes()),
    )
}

/// The fixed figures (parameters, gradients, state, buffers, fp32 within the first two).
fn fixed() -> impl Strategy<Value = (u64, u64, u64, u64, u64)> {
    (bytes(), bytes(), bytes(), bytes())
        .prop_flat_map(|(p, g, s, b)| (Just(p), Just(g), Just(s), Just(b), 0..=p + g))
}

fn categories(f: (u64, u64, u64, u64, u64), batch: u64, activations: u64, n: u64) -> Categories {
    Categories {
        step: n,
        parameters_bytes: f.0,
        gradients_bytes: f.1,
        optimizer_state_bytes: f.2,
        buffers_bytes: f.3,
        activations_bytes: activations,
        batch_size: Some(batch),
        fp32_bytes: Some(f.4),
        partial: Vec::new(),
    }
}

fn check(
    e: &CategoryEvidence,
    steps: &[(u64, u64, Option<u64>)],
    budget: Budget,
    near: u64,
) -> Result<(), TestCaseError> {
    let c = &e.split.measured;
    let r = &e.remedies;
    if let Some(x) = r.checkpointing_bytes {
        prop_assert!(x > 0 && x <= c.activations_bytes);
    }
    if let Some(x) = r.bf16_bytes {
        prop_assert!(x > 0 && x <= (c.parameters_bytes + c.gradients_bytes) / 2);
    }
    if let Some(s) = r.sharding {
        prop_assert!(s.frees_bytes > 0 && s.frees_bytes <= c.optimizer_state_bytes);
    }
    let text = remedies_text(e);
    for nothing in ["frees 0 B", "free 0 B", "up to 0 B", " -"] {
        prop_assert!(!text.contains(nothing), "{}", text);
    }
    prop_assert!(!text.contains("NaN") && !text.contains("inf"), "{}", text);
    let Some(fit) = &e.fit else {
        return Ok(());
    };
    let n = fit.largest_safe_batch;
    prop_assert!(n <= MAX_BATCH);
    prop_assert_eq!(r.batch.map(|b| b.fits), Some(n));
    let room = fit.budget_bytes();
    if n > 0 {
        prop_assert!(fit.predict(n) <= room, "{:?}", fit);
    }
    if n < MAX_BATCH {
        prop_assert!(fit.predict(n + 1) > room, "{:?}", fit);
    }
    if let Some(err) = fit.max_error_ratio {
        prop_assert!(err <= fit::MAX_LINE_ERROR);
    }
    // Never under a peak measured at a batch seen; what does not scale within every peak.
    let peaks: Vec<(u64, u64)> = steps.iter().filter_map(|s| Some((s.0, s.2?))).collect();
    for &(b, p) in &peaks {
        prop_assert!(
            fit.predict(b) >= p,
            "predicts {} at batch {b}, measured {p}",
            fit.predict(b)
        );
    }
    prop_assert!(fit.fixed_bytes <= peaks.iter().map(|p| p.1).max().unwrap_or(0));
    // near_limit's headroom test at the latest sample: when it is tight, the batch now is no fit.
    let (b, _, p) = steps[steps.len() - 1];
    let limit = budget.limit.unwrap_or(0);
    if let Some(p) = p {
        if (limit as i128 - p as i128) < i128::from(near_limit_margin(near, budget.cap)) {
            prop_assert!(n < b, "{n} fits at batch {b} with {p} of {limit}: {}", text);
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn advice_holds_over_every_accepted_split(
        f in fixed(),
        steps in proptest::collection::vec(step(), 1..6),
        limit in prop_oneof![0u64..=MAX_BYTES, 0u64..=u64::MAX],
        cap in proptest::option::of(0u64..=MAX_BYTES),
        inactive in proptest::option::of(bytes()),
        near in prop_oneof![Just(512u64 << 20), 0u64..=MAX_BYTES],
        world in proptest::option::of(prop_oneof![1u64..=1024, 0u64..=u64::MAX]),
    ) {
        let mut t = Tracker::new(near);
        for (i, &(b, a, p)) in steps.iter().enumerate() {
            t.take(categories(f, b, a, i as u64), i as f64, p);
        }
        let budget = Budget { limit: Some(limit), cap, inactive_split: inactive };
        let e = t.evidence(budget, world).expect("a split was taken");
        check(&e, &steps, budget, near)?;
    }

    /// The daemon's own near_limit, fed the latest split's sample until it fires: its evidence
    /// never names the batch now (or more) as one that fits.
    #[test]
    fn a_firing_near_limit_never_carries_a_fit_for_the_batch_now(
        f in fixed(),
        steps in proptest::collection::vec(step(), 1..4),
        total in (1u64 << 30)..=MAX_BYTES,
        reserved_share in 0u64..=100,
        cap in proptest::option::of(0u64..=MAX_BYTES),
        near in prop_oneof![Just(512u64 << 20), 0u64..=MAX_BYTES],
    ) {
        let mut t = Tracker::new(near);
        for (i, &(b, a, p)) in steps.iter().enumerate() {
            t.take(categories(f, b, a, i as u64), i as f64, p);
        }
        let (b, _, p) = steps[steps.len() - 1];
        let reserved = total / 100 * reserved_share;
        let mut detect = SessionDetect::new(&DetectConfig { headroom_margin_bytes: near, ..DetectConfig::default() });
        let mut findings = Findings::default();
        for i in 0..8u64 {
            let s = Sample {
                ts: 1_763_700_000.0 + i as f64,
                step: Some(100 + i),
                phase: "train".into(),
                stats: Stats { allocated_peak: p, reserved: Some(reserved), ..Stats::default() },
                device_free: Some(total - reserved),
                device_total: Some(total),
                alloc_limit: None,
                categories: None,
            };
            let obs = Obs {
                alloc_limit: cap,
                categories: Some(&t),
                ..Obs::of(&s)
            };
            detect.sample(&Subject::default(), &obs, &mut findings);
        }
        if let Some(finding) = detect.firing(Kind::NearLimit) {
            let fits = finding.evidence.categories.as_ref().and_then(|c| c.largest_safe_batch);
            if let Some(n) = fits {
                prop_assert!(n < b, "near_limit fires at batch {b} and says {n} fits: {}", finding.hint.as_deref().unwrap_or(""));
            }
        }
    }
}
