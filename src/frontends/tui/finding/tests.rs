use super::*;
use serde_json::json;

#[test]
fn reads_the_documented_shape() {
    let f: Finding = serde_json::from_value(json!({
        "id":"s-3/leak","kind":"leak","state":"firing","severity":"critical",
        "session":"s-3","job":"llama-ft","rank":0,"pid":4242,"ns_pid":17,
        "gpu_uuid":"GPU-1","gpu":"0","first_step":812,"first_ts":1763700406.0,
        "since":1763700406.0,"updated_ts":1763700500.0,"resolved_ts":null,
        "message":"allocated floor grows","hint":"store loss.item()",
        "evidence":{"slope_bytes_per_step":2097152.0,"oom_eta_steps":30500,"confidence":0.999},
        "attribution":{"id":1,"ts":1763700300.0,"step_from":60,"step_to":180,
            "total_growth_bytes":125829120,"sites":[{"file":"/home/alice/proj/train.py",
            "line":27,"function":"kept_outputs","bytes":125829120,"blocks":120,
            "stack":[{"file":"/home/alice/proj/train.py","line":48,"function":"run"}]}]}
    }))
    .unwrap();
    assert_eq!(f.kind, Kind::Leak);
    assert!(f.firing() && f.critical());
    assert_eq!(f.gpu, Some(0));
    assert_eq!(
        (f.subject.pid, f.subject.ns_pid, f.subject.rank),
        (4242, Some(17), Some(0))
    );
    assert_eq!(f.evidence.oom_eta_steps, Some(30500));
    assert_eq!(f.sort_ts(), 1763700406.0);
    let a = f.attribution.as_ref().unwrap();
    assert_eq!(a.sites[0].short(), "train.py:27");
}

#[test]
fn a_newer_daemons_kinds_states_and_severities_read_as_unknown() {
    let f: Finding = serde_json::from_value(json!({
        "id":"s-9/thrash","kind":"thrash","state":"silenced","severity":"info",
        "session":"s-9","pid":1,"first_ts":1.0,"updated_ts":2.0,"message":"m",
        "evidence":{},"new_field":[1, 2]
    }))
    .unwrap();
    assert_eq!(f.kind, Kind::Unknown);
    assert_eq!(f.kind.as_str(), "unknown");
    assert_eq!(f.state(), State::Other);
    assert_eq!(f.severity, Severity::Unknown);
    assert!(!f.firing() && !f.critical());
    assert_eq!(f.badge(), "unknown");
    assert_eq!(f.label(), "unknown");
}

#[test]
fn an_explained_oom_names_its_pattern_and_whether_the_run_went_on() {
    let oom = |explanation: serde_json::Value, survived: bool| -> Finding {
        serde_json::from_value(json!({
            "id":"s-4/oom","kind":"oom","state":"firing","severity":"warning",
            "session":"s-4","pid":7,"first_ts":1.0,"updated_ts":2.0,"message":"m",
            "evidence":{"alloc_bytes":1024,"explanation":explanation,"survived":survived}
        }))
        .unwrap()
    };
    for (pattern, label) in [
        ("pressure", "oom pressure"),
        ("fragmentation", "oom frag"),
        ("leak", "oom leak"),
        ("unknown", "oom"),
        ("thrash", "oom"),
    ] {
        let f = oom(json!({"pattern": pattern}), false);
        assert_eq!(f.label(), label, "{pattern}");
        assert!(f.label().chars().count() <= 13);
        assert!(f.explanation().is_some() && !f.survived());
    }
    let f = oom(json!(null), true);
    assert!(f.explanation().is_none() && f.survived());
    assert_eq!(f.label(), "oom");
    // Only an OOM carries these: evidence on another kind is not read as one.
    let mut leak = oom(json!({"pattern": "leak"}), true);
    leak.kind = Kind::Leak;
    assert!(leak.explanation().is_none() && !leak.survived());
    assert_eq!(leak.label(), "leak");
}

#[test]
fn one_rule_joins_a_finding_to_a_row() {
    let of = |session: &str, gpu: Option<&str>| -> Finding {
        serde_json::from_value(json!({
            "id":"x","kind":"leak","state":"firing","severity":"warning",
            "session":session,"pid":4242,"gpu":gpu,"first_ts":1.0,"updated_ts":1.0,
            "message":"","evidence":{}
        }))
        .unwrap()
    };
    let trainer = of("s-3", Some("1"));
    assert_eq!(trainer.gpu_index(), Some(1));
    // A trainer's finding belongs to its session, whatever pid the row shows.
    assert!(trainer.concerns(Some("s-3"), 1, Some(0)));
    assert!(!trainer.concerns(Some("s-4"), 4242, Some(1)));
    // A row without a session (a plain process): by pid and GPU.
    assert!(trainer.concerns(None, 4242, Some(1)));
    assert!(!trainer.concerns(None, 4242, Some(0)));
    assert!(!trainer.concerns(None, 4243, Some(1)));
    // An aggregate (no session): by pid, and by GPU where both know it.
    let aggregate = of("", None);
    assert!(aggregate.concerns(Some("s-3"), 4242, Some(0)));
    assert!(!aggregate.concerns(Some("s-3"), 4243, None));
    let on_gpu = of("", Some("2"));
    assert!(on_gpu.concerns(Some("s-3"), 4242, None));
    assert!(!on_gpu.concerns(Some("s-3"), 4242, Some(0)));
}

#[test]
fn a_cache_growth_finding_reads_back_with_its_own_badge() {
    let f: Finding = serde_json::from_value(json!({
        "id":"s-9/cache_growth","kind":"cache_growth","state":"firing","severity":"warning",
        "session":"s-9","pid":1,"first_ts":1.0,"updated_ts":2.0,"message":"m",
        "evidence":{"alloc_conf":"expandable_segments:True","reserved_bytes":1}
    }))
    .unwrap();
    assert_eq!(f.kind, Kind::CacheGrowth);
    assert_eq!(f.badge(), "cache");
    assert_eq!(
        f.evidence.alloc_conf.as_deref(),
        Some("expandable_segments:True")
    );
}
