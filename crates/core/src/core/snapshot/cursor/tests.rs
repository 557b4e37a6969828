use super::*;

#[test]
fn a_cursor_reads_back_what_it_was_written_with() {
    let procs = [(0, u64::MAX), (3, 17)];
    let sessions = vec![(17, 3600), (3, 1), (4, 0), (40, 9)];
    let text = Cursor::write(1_795_741_561_393, &procs, sessions);
    assert!(text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
    let c = Cursor::parse(&text).unwrap();
    assert_eq!(c.gpu_ms, 1_795_741_561_393);
    assert_eq!(c.procs, procs);
    assert_eq!(c.sessions, vec![(3, 1), (17, 3600), (40, 9)]);
    assert_eq!((c.samples(17), c.samples(4), c.samples(99)), (3600, 0, 0));
    let empty = Cursor::parse(&Cursor::write(0, &[], vec![])).unwrap();
    assert_eq!(empty, Cursor::default());
}

#[test]
fn another_daemons_or_a_damaged_cursor_is_not_honoured() {
    let ours = Cursor::write(5, &[(0, 1)], vec![(1, 2)]);
    let rest = ours.split_once('.').unwrap().1;
    for bad in [
        format!("zzzz.{rest}"),
        String::new(),
        instance().to_string(),
        format!("{ours}.x"),
        format!("{ours}_1-+2"),
        format!("{ours}_1"),
        ours.replace('.', "%2E"),
    ] {
        assert_eq!(Cursor::parse(&bad), None, "{bad}");
    }
}

#[test]
fn sessions_past_the_length_bound_are_left_out_to_be_sent_whole() {
    let many: Vec<_> = (1..=5000).map(|k| (k * 1000, 3600)).collect();
    let text = Cursor::write(1, &[], many);
    assert!(text.len() <= MAX_LEN);
    let c = Cursor::parse(&text).unwrap();
    assert!(c.sessions.len() > 400, "{}", c.sessions.len());
    assert_eq!(c.samples(1000), 3600);
    assert_eq!(c.samples(5_000_000), 0);
}

#[test]
fn session_keys_are_the_ids_last_number() {
    assert_eq!(session_key("s-mi8dfxmo-17"), Some(17));
    assert_eq!(session_key("s-17"), Some(17));
    assert_eq!(session_key("s-x"), None);
}
