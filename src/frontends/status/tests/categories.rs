//! The trainer table's memory line: where each trainer's memory went at its latest measured
//! step, under its row, with the largest batch predicted to fit.

use crate::frontends::tui::fixtures;

use super::super::{table, Origin};

fn daemon() -> Origin {
    Origin::Daemon("http://127.0.0.1:9477/api/v1/snapshot".into())
}

/// The line under the row that names `job`.
fn under<'a>(out: &'a str, job: &str) -> Option<&'a str> {
    let mut lines = out.lines();
    lines.find(|l| l.starts_with(job))?;
    lines.next()
}

#[test]
fn a_trainer_with_a_split_gets_its_memory_line_under_its_row() {
    let out = table(&fixtures::proportional_split(), &daemon());
    assert_eq!(
        under(&out, "gpt-small"),
        Some(
            "  memory: parameters 3.0 GiB, gradients 3.0 GiB, optimizer state 6.0 GiB, \
             activations 4.5 GiB, other 1.5 GiB (step 1500, batch 16); largest safe batch 15"
        ),
        "{out}"
    );
    let out = table(&fixtures::fitted_split(), &daemon());
    let line = under(&out, "gpt-small").unwrap();
    assert!(
        line.starts_with("  memory: parameters 3.0 GiB, gradients 3.0 GiB, optimizer state 6.0 GiB, buffers 64.0 MiB, activations 3.1 GiB, other "),
        "{out}"
    );
    assert!(
        line.contains("(step 1200, batch 12); largest safe batch "),
        "{out}"
    );
}

/// No batch, activations not seen: the split says so, and the partial reasons' codes follow,
/// escaped as every string a trainer sends.
#[test]
fn a_partial_split_names_what_is_off_escaped() {
    let mut snap = fixtures::partial_split();
    if let Some(c) = snap.sessions[0].categories.as_mut() {
        c.measured.partial[1] = format!("zero3\u{1b}[2J_partitions{}", "\u{7}: 96 parameters");
    }
    let out = table(&snap, &daemon());
    assert_eq!(
        under(&out, "gpt-small"),
        Some(
            "  memory: parameters 384.0 MiB, gradients 384.0 MiB, optimizer state 768.0 MiB, \
             activations not measured, other 16.5 GiB (step 3); \
             partial: activations_unmeasured, zero3\\u{1b}[2J_partitions\\u{7}"
        ),
        "{out}"
    );
    assert!(!out.chars().any(|c| c != '\n' && c.is_control()), "{out:?}");
}

#[test]
fn no_batch_fits_is_said_and_no_split_means_no_line() {
    let mut snap = fixtures::proportional_split();
    snap.sessions[0].largest_safe_batch = Some(0);
    let out = table(&snap, &daemon());
    assert!(
        under(&out, "gpt-small")
            .is_some_and(|l| l.ends_with("(step 1500, batch 16); no batch fits")),
        "{out}"
    );
    snap.sessions[0].categories = None;
    let out = table(&snap, &daemon());
    assert!(!out.contains("memory:"), "{out}");
    let out = table(&fixtures::crowded("n", 2, 4, 2), &daemon());
    assert!(!out.contains("memory:"), "{out}");
}
