use super::*;
use crate::core::input::Lines;
use crate::core::store::sessions::SessionLimits;
use crate::core::trainer::Peer;

const PEER: Peer = Peer {
    pid: 7,
    uid: 1000,
    gid: 1000,
};

fn hello(core: &mut Core, uuid: &str) -> Link {
    let mut lines = Box::new(Lines::new(Link::new(PEER)));
    lines.now = 1.0;
    lines.messages.push(Message::Hello(Hello {
        job: Some("j".into()),
        gpu_uuid: Some(uuid.into()),
        ..Hello::default()
    }));
    let done = core.lines(lines);
    assert!(matches!(done.applied[..], [Applied::Opened(_)]));
    done.link
}

#[test]
fn a_replayed_gpu_note_names_the_gpu_of_the_sessions_transitions() {
    let mut core = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let link = hello(&mut core, "MIG-1");
    core.note(link, Note::Gpu(3));
    let closed = core.close(Close {
        link,
        how: Closing::Crash,
        now: 2.0,
    });
    assert!(closed.note.is_none(), "not recorded: no note");
    let crash: Vec<_> = core.transitions();
    assert_eq!(crash.len(), 1);
    assert_eq!(crash[0].gpu, Some(3));
    assert!(core.transitions().is_empty(), "drained");
}

#[test]
fn lines_without_a_session_are_refused_and_a_recorded_close_leaves_its_note() {
    let mut core = Core::with_sessions(Sessions::new(SessionLimits::default()));
    let mut lines = Box::new(Lines::new(Link::new(PEER)));
    lines.messages.push(Message::Bye { ts: None });
    let done = core.lines(lines);
    assert_eq!(done.applied, [Applied::Refused(Refusal::NoHello)]);
    let mut link = hello(&mut core, "GPU-1");
    link.recorded = true;
    let closed = core.close(Close {
        link,
        how: Closing::DaemonStopped,
        // A daemon's clock: the note reads back only with a Unix time.
        now: 1_763_700_003.0,
    });
    let note = closed.note.unwrap_or_default();
    assert_eq!(
        trace::recorder_line(&note),
        Some(trace::RecorderLine::Ended(trace::DAEMON_STOPPED.into()))
    );
}

/// Opens a session with a hello batch carrying `id` (none: the store's own numbering).
fn open_named(core: &mut Core, id: Option<&str>) -> (Link, String) {
    let mut lines = Box::new(Lines::new(Link::new(PEER)));
    lines.now = 1.0;
    lines.session_id = id.map(str::to_string);
    lines.messages.push(Message::Hello(Hello::default()));
    let done = core.lines(lines);
    match &done.applied[..] {
        [Applied::Opened(o)] => (done.link, o.id.clone()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_hello_given_an_id_opens_its_session_under_it_and_the_store_finds_it() {
    let mut core = Core::with_sessions(Sessions::new(SessionLimits::default()).with_id_epoch(5.0));
    let (given, id) = open_named(&mut core, Some("s-mi8dfxmo-9"));
    assert_eq!(id, "s-mi8dfxmo-9");
    // Without one, the store's numbering, past the key the first took.
    let (own, own_id) = open_named(&mut core, None);
    assert_eq!(own_id, "s-3uw-2");
    for (link, id) in [(given, "s-mi8dfxmo-9"), (own, "s-3uw-2")] {
        let s = core.sessions().get(id).expect("live, by its id");
        assert_eq!(
            Some(s.id.as_str()),
            link.session
                .and_then(|k| core.sessions().live_session(k))
                .map(|s| s.id.as_str())
        );
        core.close(Close {
            link,
            how: Closing::Crash,
            now: 2.0,
        });
        assert!(
            core.sessions().get(id).is_some_and(|s| s.ended.is_some()),
            "ended, by its id"
        );
    }
    assert!(
        core.sessions().get("s-3uw-1").is_none(),
        "no session took the first key's own id"
    );
}
