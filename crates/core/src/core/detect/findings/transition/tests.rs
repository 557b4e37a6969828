use super::super::{Evidence, Kind, Subject};
use super::*;

fn firing(session: &str, kind: Kind, severity: Severity) -> Finding {
    Finding {
        id: format!("{session}/{kind}"),
        kind,
        state: FindingState::Firing,
        severity,
        subject: Subject {
            session: session.into(),
            rank: Some(3),
            ..Subject::default()
        },
        gpu: None,
        first_step: None,
        first_ts: 10.0,
        since: Some(10.0),
        updated_ts: 12.0,
        resolved_ts: None,
        message: "connection closed without bye".into(),
        hint: None,
        evidence: Evidence::default(),
        attribution: None,
        peak: None,
        consequence_of: None,
    }
}

fn of(session: &str, rank: Option<u64>, host: Option<&str>) -> ConsequenceOf {
    ConsequenceOf {
        session: session.into(),
        rank,
        kind: Kind::Oom,
        host: host.map(Into::into),
    }
}

#[test]
fn resolving_sets_the_time_and_says_why_only_when_told() {
    let mut f = firing("s-3", Kind::Leak, Severity::Warning);
    assert!(f.transition(Transition::Resolve {
        at: 20.0,
        why: None
    }));
    assert_eq!(
        (f.state, f.resolved_ts, f.updated_ts),
        (FindingState::Resolved, Some(20.0), 20.0)
    );
    assert_eq!(f.message, "connection closed without bye");
    assert_eq!(f.evidence.detail, None);

    let mut f = firing("s-3", Kind::Crash, Severity::Critical);
    let why = "counted in crashes-1";
    f.transition(Transition::Resolve {
        at: 21.0,
        why: Some(why),
    });
    assert_eq!(
        f.message,
        "connection closed without bye; counted in crashes-1"
    );
    assert_eq!(f.evidence.detail.as_deref(), Some(why));
    // The severity stays what it was: a resolved crash paged.
    assert_eq!(f.severity, Severity::Critical);
}

#[test]
fn a_resolved_finding_is_final() {
    let mut f = firing("s-3", Kind::Crash, Severity::Critical);
    f.transition(Transition::Resolve {
        at: 20.0,
        why: None,
    });
    let before = f.clone();
    assert!(!f.transition(Transition::Resolve {
        at: 30.0,
        why: Some("again")
    }));
    let o = of("s-5", Some(5), None);
    assert!(!f.transition(Transition::ConsequenceOf { of: &o, at: 31.0 }));
    assert_eq!(f, before);
}

#[test]
fn a_consequence_is_a_warning_naming_what_it_followed() {
    let mut f = firing("s-3", Kind::Crash, Severity::Critical);
    let o = of("s-5", Some(5), Some("node-b"));
    assert!(f.transition(Transition::ConsequenceOf { of: &o, at: 11.0 }));
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(f.state, FindingState::Firing);
    assert_eq!(f.consequence_of.as_ref(), Some(&o));
    assert_eq!(
        f.message,
        "connection closed without bye; after rank 5's oom on node-b (s-5)"
    );
    // Its time never goes back.
    assert_eq!(f.updated_ts, 12.0);
}

#[test]
fn an_overturned_cause_names_the_earlier_failure_once() {
    // s-3's crash was taken to follow its own OOM, then an earlier OOM of s-5 is read.
    let mut f = firing("s-3", Kind::Crash, Severity::Critical);
    let own = of("s-3", Some(3), None);
    f.transition(Transition::ConsequenceOf { of: &own, at: 12.0 });
    assert_eq!(
        f.message,
        "connection closed without bye; after its own oom"
    );
    let earlier = of("s-5", None, None);
    f.transition(Transition::ConsequenceOf {
        of: &earlier,
        at: 15.0,
    });
    assert_eq!(
        f.message,
        "connection closed without bye; after session s-5's oom (s-5)"
    );
    assert_eq!(f.consequence_of.as_ref(), Some(&earlier));
    assert_eq!(f.updated_ts, 15.0);
}
