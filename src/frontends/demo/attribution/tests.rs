use super::*;
use crate::sources::ingest::protocol::{parse, Message};

/// What the daemon's parser makes of a line this trainer sends.
fn daemon_reads(v: &Value) -> Attribution {
    match parse(v.to_string().as_bytes()) {
        Ok(Message::Attribution(a)) => a,
        other => panic!("{v} parsed as {other:?}"),
    }
}

/// A Unix time, as the daemon insists.
const T: f64 = 1.8e9;

fn mark(step: u64, ts: f64, active: u64) -> Mark {
    Mark {
        step,
        ts: T + ts,
        active,
    }
}

#[test]
fn a_request_parses_and_other_lines_do_not() {
    let line = r#"{"type":"attribute","v":1,"id":3,"finding":"s-2/leak","steps":20,"seconds":120,"max_entries":4000,"top":10}"#;
    let r = Request::parse(line).unwrap();
    assert_eq!((r.id, r.steps, r.seconds, r.top), (3, 20, 120.0, 10));
    assert!(Request::parse(r#"{"type":"welcome","v":1,"session":"s-1"}"#).is_none());
    assert!(Request::parse(&line.replace(r#""v":1"#, r#""v":2"#)).is_none());
    assert!(Request::parse(r#"{"type":"attribute","v":1,"steps":2,"seconds":1}"#).is_none());
    assert!(Request::parse("not json").is_none());
}

#[test]
fn the_window_waits_a_recorded_step_then_steps_or_seconds() {
    let req =
        Request::parse(r#"{"type":"attribute","v":1,"id":1,"steps":20,"seconds":60,"top":10}"#)
            .unwrap();
    let mut w = Window::new(req.clone(), 100);
    let per = Profile::Leak.leak_per_step().unwrap();
    assert!(w.on_step(Profile::Leak, mark(100, 0.0, 0)).is_none());
    assert!(w.on_step(Profile::Leak, mark(101, 0.2, 1_000)).is_none());
    assert!(w.on_step(Profile::Leak, mark(120, 4.0, 2_000)).is_none());
    let a = w
        .on_step(Profile::Leak, mark(121, 4.2, 1_000 + 20 * per))
        .unwrap();
    assert_eq!(a["type"], "attribution");
    assert_eq!(
        (
            a["id"].as_u64(),
            a["step_from"].as_u64(),
            a["step_to"].as_u64()
        ),
        (Some(1), Some(101), Some(121))
    );
    assert!((a["seconds"].as_f64().unwrap() - 4.0).abs() < 1e-9);
    assert_eq!(a["total_growth_bytes"].as_u64(), Some(20 * per));
    let top = &a["sites"][0];
    assert_eq!(
        (top["file"].as_str(), top["line"].as_u64()),
        (Some(TRAIN), Some(27))
    );
    assert_eq!(
        (top["bytes"].as_u64(), top["blocks"].as_u64()),
        (Some(20 * per), Some(20))
    );
    // The real client's stack: the site first, then the user's frames outward.
    assert_eq!(top["stack"][0]["function"], "kept_outputs");
    assert_eq!(top["stack"][1]["line"], 48);
    let back = daemon_reads(&a);
    assert_eq!(back.top().map(Site::short).as_deref(), Some("train.py:27"));
    assert!(a.to_string().len() < 60_000);

    // Seconds cap the window when steps are slow; a healthy trainer has no sites.
    let mut w = Window::new(req, 5);
    assert!(w.on_step(Profile::Healthy, mark(6, 10.0, 500)).is_none());
    let a = w.on_step(Profile::Healthy, mark(8, 70.0, 400)).unwrap();
    assert_eq!(a["sites"].as_array().map(Vec::len), Some(0));
    assert_eq!(a["total_growth_bytes"].as_u64(), Some(0));
}

#[test]
fn a_window_cut_short_says_how_far_it_got_and_a_second_request_is_refused() {
    let req =
        Request::parse(r#"{"type":"attribute","v":1,"id":4,"steps":20,"seconds":60,"top":10}"#)
            .unwrap();
    let mut w = Window::new(req.clone(), 10);
    let a = w.cut_short(T + 1.0, "trainer died: OutOfMemoryError");
    assert_eq!(
        (a["id"].as_u64(), a["error"].as_str()),
        (Some(4), Some("cut_short"))
    );
    assert!(a.get("step_from").is_none(), "{a}");
    assert!(a["detail"]
        .as_str()
        .unwrap()
        .ends_with("before the window began (recording, its first step not over)"));
    assert!(w.on_step(Profile::Leak, mark(11, 2.0, 0)).is_none());
    assert!(w.on_step(Profile::Leak, mark(14, 2.6004, 0)).is_none());
    let a = w.cut_short(T + 3.0, "trainer died: OutOfMemoryError");
    assert_eq!(
        (a["step_from"].as_u64(), a["step_to"].as_u64()),
        (Some(11), Some(14))
    );
    assert_eq!(a["seconds"].as_f64(), Some(0.6));
    assert_eq!(
        a["detail"],
        "trainer died: OutOfMemoryError, 3 step(s) into the window"
    );
    let back = daemon_reads(&a);
    assert!(back.sites.is_empty());
    assert_eq!(back.error.as_deref(), Some("cut_short"));

    let again = Request { id: 5, ..req };
    let b = busy(&again, &w, T + 3.0);
    assert_eq!(
        (b["id"].as_u64(), b["error"].as_str()),
        (Some(5), Some("failed"))
    );
    assert_eq!(b["detail"], "a window is already open (request 4)");
    assert_eq!(daemon_reads(&b).error.as_deref(), Some("failed"));
}
