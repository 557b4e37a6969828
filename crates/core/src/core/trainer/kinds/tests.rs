use super::*;

#[test]
fn every_word_reads_back_as_written() {
    for w in [
        "oom",
        "phase",
        "mark",
        "snapshot",
        "crash",
        "idle_timeout",
        "attribution_requested",
        "attribution",
        "attribution_failed",
        "checkpoint",
    ] {
        let k = EventKind::parse(w);
        assert_eq!(k.as_str(), w);
        let json = serde_json::to_string(&k).unwrap();
        assert_eq!(json, format!("\"{w}\""));
        assert_eq!(serde_json::from_str::<EventKind>(&json).unwrap(), k);
    }
    assert_eq!(EventKind::parse("oom"), EventKind::Oom);
    assert_eq!(EventKind::parse("nap"), EventKind::Other("nap".into()));
    for w in ["train", "eval", "warmup"] {
        let p = Phase::parse(w);
        assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{w}\""));
        assert_eq!(p.is_train(), w == "train");
    }
    assert_eq!(Phase::default(), Phase::Train);
}
