#![allow(clippy::unwrap_used)]
use crate::frontends::status::{table, Origin};
use crate::frontends::tui::fixtures;

fn direct() -> Origin {
    Origin::Direct {
        reason: "--direct".into(),
    }
}

#[test]
fn every_column_of_the_printed_tables_is_in_the_legend() {
    let snap = fixtures::crowded("gpu-node-1", 2, 4, 2);
    let out = table(&snap, &direct());
    let (tables, legend) = out.split_once("\nlegend\n").unwrap();
    for word in [
        "USED",
        "RESERVED",
        "RANK",
        "ALLOCATED",
        "OUTSIDE",
        "FINDINGS",
        "KIND",
    ] {
        assert!(tables.contains(word), "{word} is not a column:\n{tables}");
        assert!(
            legend.contains(&format!("  {word} ")),
            "{word} is not explained:\n{legend}"
        );
    }
    // RESERVED means two things, and the legend says which is which.
    assert!(legend.contains("in the GPU table"), "{legend}");
    assert!(legend.contains("in the trainer table"), "{legend}");
}

#[test]
fn a_node_without_trainers_explains_only_its_own_columns() {
    let snap = fixtures::crowded("gpu-node-1", 1, 2, 0);
    let out = table(&snap, &direct());
    let legend = out.split_once("\nlegend\n").unwrap().1;
    assert!(legend.contains("  KIND "), "{legend}");
    assert!(!legend.contains("OUTSIDE"), "{legend}");
    assert!(!legend.contains("ALLOCATED"), "{legend}");
}

#[test]
fn an_unknown_outside_says_why_as_the_tui_does() {
    let mut snap = fixtures::crowded("gpu-node-1", 1, 2, 1);
    let l = snap.sessions[0].ledger.as_mut().unwrap();
    l.outside_allocator_bytes = None;
    l.unknown =
        Some("NVML lists no memory for this pid (another container's pid namespace?)".into());
    let out = table(&snap, &direct());
    let rows: Vec<&str> = out.lines().collect();
    let row = rows
        .iter()
        .position(|r| r.starts_with("job-0") && r.contains(" ?  "))
        .unwrap_or_else(|| panic!("no row with OUTSIDE ?:\n{out}"));
    assert_eq!(
        rows[row + 1],
        "  outside the allocator: ? (NVML lists no memory for this pid (another container's pid namespace?))"
    );
    // Each row whose OUTSIDE is `?` has its reason under it, and only those.
    let reasons = rows
        .iter()
        .filter(|r| r.starts_with("  outside the allocator: ? ("))
        .count();
    let unknown = snap
        .sessions
        .iter()
        .filter(|s| {
            s.ledger
                .as_ref()
                .is_some_and(|l| l.outside_allocator_bytes.is_none())
        })
        .count();
    assert_eq!(reasons, unknown, "{out}");
}
