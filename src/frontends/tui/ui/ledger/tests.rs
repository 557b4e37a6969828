use super::*;

#[test]
fn the_bar_fills_its_cells_in_proportion_and_shows_small_parts() {
    assert_eq!(bar(&[52, 14, 4], 35), vec![26, 7, 2]);
    // A part of 1% still gets a cell; the cells add up.
    let b = bar(&[99, 0, 1], 20);
    assert_eq!(b.iter().sum::<usize>(), 20);
    assert_eq!((b[1], b[2]), (0, 1));
    assert_eq!(bar(&[0, 0, 0], 10), vec![0, 0, 0]);
}

#[test]
fn an_unknown_part_says_why() {
    let l = Ledger {
        nvml_used_bytes: Some(3 << 30),
        allocated_bytes: Some(1 << 30),
        cached_bytes: Some(1 << 30),
        cached_fragmented_bytes: None,
        outside_allocator_bytes: None,
        age_seconds: Some(0.5),
        unknown: Some("2 trainer sessions share this process on this GPU".into()),
    };
    let text: String = line(&l, 120, false, Theme::new(false))
        .spans
        .iter()
        .map(|s| s.content.to_string())
        .collect();
    assert_eq!(
        text,
        "NVML 3.0 GiB · outside the allocator: ? (2 trainer sessions share this process on this GPU)"
    );
}
