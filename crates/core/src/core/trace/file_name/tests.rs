use super::*;

fn name(session: &str, job: Option<&str>, rank: Option<u64>, more: &str) -> String {
    format!(
        "{}{more}{SUFFIX}",
        base(1_764_950_000.5, session, job, rank)
    )
}

#[test]
fn the_id_the_recorder_put_in_a_name_reads_back() {
    let cases: &[(&str, Option<&str>, Option<u64>)] = &[
        ("s-mi8dfxmo-17", Some("cascade"), Some(5)),
        ("s-mi8dfxmo-3", None, None),
        ("s-7", Some("train"), Some(0)),
        // A job whose name begins as a daemon's id ends: the hello's job tells them apart.
        ("s-7", Some("12-x"), None),
        ("s-mi8dfxmo-1", Some("12-x"), Some(2)),
        ("s-mi8dfxmo-1", Some("a job/with spaces"), None),
    ];
    for &(id, job, rank) in cases {
        for more in ["", ".p2", "-2", ".p1-3"] {
            let n = name(id, job, rank, more);
            assert_eq!(
                session_of(&n, job, rank).as_deref(),
                Some(id),
                "{n} with job {job:?} rank {rank:?}"
            );
            assert_eq!(
                session_of(&format!("/some/dir/{n}"), job, rank).as_deref(),
                Some(id)
            );
        }
    }
}

#[test]
fn a_name_the_recorder_did_not_give_holds_no_id() {
    for n in [
        "oom.jsonl",
        "gpumon-s-7-train.trace.jsonl",
        "gpumon-12-x-7-train.trace.jsonl",
        "gpumon-12-s--train.trace.jsonl",
        "gpumon-12-s-ab-train.trace.jsonl",
    ] {
        assert_eq!(session_of(n, Some("train"), None), None, "{n}");
    }
    // The hello names another job or rank than the name: not this recorder's name for it.
    let n = name("s-mi8dfxmo-17", Some("a"), Some(1), "");
    assert_eq!(session_of(&n, Some("b"), Some(1)), None);
    assert_eq!(session_of(&n, Some("a"), Some(2)), None);
}
