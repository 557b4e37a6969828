use super::*;

#[test]
fn each_run_opens_under_its_own_id_and_none_twice() {
    let mut ids = Ids::recorded(vec![
        Some("s-mi8dfxmo-1".into()),
        None,
        Some("s-2".into()),
        Some("s-mi8dfxmo-1".into()),
    ]);
    assert_eq!(ids.take(0), "s-mi8dfxmo-1");
    // No id in its name: numbered, past `s-2` which a trace holds.
    assert_eq!(ids.take(1), "s-1");
    // The second run to hold an id is numbered.
    assert_eq!(ids.take(3), "s-3");
    assert_eq!(ids.take(2), "s-2");
    // A second session in one run.
    assert_eq!(ids.take(0), "s-4");
}
