//! An explained OOM in the sinks: Alertmanager annotations name the pattern, the line that
//! asked, the top live site and whether the run went on; a survived OOM ends its critical alert;
//! the webhook carries the whole explanation.

use super::*;
use crate::core::detect::explanation::Explanation;
use crate::core::detect::findings::{Severity, Subject};
use crate::core::detect::{Evidence, Kind};

fn explained_oom(survived: bool) -> Finding {
    let x: Explanation = serde_json::from_str(include_str!(
        "../../../tests/fixtures/oom/fragmentation.json"
    ))
    .unwrap();
    Finding {
        id: "s-5/oom".into(),
        kind: Kind::Oom,
        state: FindingState::Firing,
        severity: if survived {
            Severity::Warning
        } else {
            Severity::Critical
        },
        subject: Subject::default(),
        gpu: None,
        first_step: Some(220),
        first_ts: 10.0,
        since: Some(10.0),
        updated_ts: 11.0,
        resolved_ts: None,
        message: "CUDA out of memory (fragmentation): ...".into(),
        hint: None,
        evidence: Evidence {
            explanation: Some(Box::new(x)),
            survived: survived.then_some(true),
            ..Evidence::default()
        },
        attribution: None,
        peak: None,
        consequence_of: None,
    }
}

#[test]
fn an_explained_oom_alert_names_pattern_lines_and_what_held_the_memory() {
    let a = alertmanager::alert(&explained_oom(false), "node1", "http://x/api", 240.0);
    let ann = &a["annotations"];
    assert_eq!(ann["oom_pattern"], "fragmentation");
    assert_eq!(
        ann["oom_failing_site"],
        "/home/alice/proj/oomlib.py:37 in dev_big"
    );
    assert_eq!(
        ann["oom_top_live_site"],
        "/home/alice/proj/oomlib.py:32 in dev_pin: 1.2 GiB, 95% of live memory"
    );
    assert_eq!(ann["oom_survived"], "false");
    assert_eq!(a["labels"]["severity"], "critical");
    // Only the finding itself while the OOM may still be fatal.
    assert_eq!(
        alertmanager::alerts(&explained_oom(false), "node1", "http://x/api", 240.0).len(),
        1
    );
    // Without an explanation: only whether it survived, no empty annotations.
    let mut plain = explained_oom(false);
    plain.evidence.explanation = None;
    let a = alertmanager::alert(&plain, "node1", "http://x/api", 240.0);
    assert!(a["annotations"].get("oom_pattern").is_none());
    assert_eq!(a["annotations"]["oom_survived"], "false");
    // Other kinds carry none of them.
    let mut leak = explained_oom(false);
    leak.kind = Kind::Leak;
    let a = alertmanager::alert(&leak, "node1", "http://x/api", 240.0);
    assert!(a["annotations"].get("oom_survived").is_none());
}

#[test]
fn a_survived_oom_is_a_warning_and_ends_the_critical_alert_it_raised() {
    let f = explained_oom(true);
    let sent = alertmanager::alerts(&f, "node1", "http://x/api", 240.0);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0]["labels"]["severity"], "warning");
    assert_eq!(sent[0]["annotations"]["oom_survived"], "true");
    assert_eq!(sent[1]["labels"]["severity"], "critical");
    assert_eq!(sent[1]["labels"]["finding"], "s-5/oom");
    // Ended at the downgrade, not some minutes ahead.
    assert_eq!(sent[1]["endsAt"], rfc3339(11.0));
    assert_ne!(sent[0]["endsAt"], rfc3339(11.0));
}

#[test]
fn the_webhook_carries_the_whole_explanation_and_survived() {
    let body = webhook::body("node1", &[explained_oom(true)]);
    let e = &body["findings"][0]["evidence"];
    assert_eq!(e["survived"], true);
    assert_eq!(e["explanation"]["pattern"], "fragmentation");
    assert_eq!(e["explanation"]["failing_site"]["line"], 37);
    assert_eq!(e["explanation"]["live_sites"][0]["bytes"], 1_321_205_760u64);
    assert_eq!(body["findings"][0]["severity"], "warning");
}
