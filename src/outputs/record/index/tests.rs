use super::*;

fn id(ino: u64) -> Ident {
    Ident { dev: 1, ino }
}

#[test]
fn entries_leave_oldest_first_with_their_names_through_compaction() {
    let mut ix = Index::default();
    let name = |i: usize| format!("gpumon-{i}-s-{i}-job-r{}.trace.jsonl", i % 7);
    // Enough to compact several times while some are still held.
    for i in 0..30_000 {
        let inst = format!("{}-x", i % 100);
        ix.push(&name(i), Some(&inst), i as u64, id(i as u64));
        if i % 3 == 2 {
            let j = i / 3 * 2;
            let f = ix.pop_oldest().unwrap();
            assert_eq!(
                (f.name, f.bytes, f.ident),
                (name(j), j as u64, id(j as u64))
            );
            let f = ix.pop_oldest().unwrap();
            assert_eq!(f.name, name(j + 1));
        }
    }
    assert_eq!(ix.len(), 10_000);
    assert_eq!(ix.newest_of("42-x"), Some(name(29_942)));
    assert_eq!(ix.newest_of("42-"), None);
    let mut next = 20_000;
    while let Some(f) = ix.pop_oldest() {
        assert_eq!(f.name, name(next));
        next += 1;
    }
    assert_eq!(next, 30_000);
    // Empty again: the buffers went back.
    assert!(
        ix.names.capacity() <= 2 * COMPACT_AT,
        "{}",
        ix.names.capacity()
    );
    assert!(ix.entries.capacity() <= 2048);
}
