use super::super::{parse, Code, Message};

fn line(from: u64, to: u64) -> String {
    format!(
        r#"{{"type":"attribution","id":1,"ts":1763700300.0,"step_from":{from},"step_to":{to},"total_growth_bytes":0,"sites":[]}}"#
    )
}

#[test]
fn a_window_that_ends_before_it_starts_is_refused_naming_both_ends() {
    let err = parse(line(730, 610).as_bytes()).unwrap_err();
    assert_eq!(err.code, Code::BadField, "{}", err.message);
    assert!(
        err.message.contains("step_from = 730") && err.message.contains("step_to = 610"),
        "{}",
        err.message
    );
    // A window of one step, and the ordinary one, are kept.
    for (from, to) in [(610, 610), (610, 730)] {
        let Ok(Message::Attribution(a)) = parse(line(from, to).as_bytes()) else {
            panic!("{from}..{to} refused");
        };
        assert_eq!((a.step_from, a.step_to), (Some(from), Some(to)));
    }
}
