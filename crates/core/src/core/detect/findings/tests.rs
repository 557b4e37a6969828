use super::*;

fn crash(session: u64, job: &str, ts: Timestamp) -> Finding {
    Finding {
        id: format!("s-{session}/crash"),
        kind: Kind::Crash,
        state: FindingState::Firing,
        severity: Severity::Critical,
        subject: Subject {
            session: format!("s-{session}"),
            job: Some(job.into()),
            run_id: None,
            uid: None,
            rank: Some(session),
            pid: 100 + session as u32,
            ns_pid: None,
            gpu_uuid: Some("GPU-1".into()),
        },
        gpu: None,
        first_step: None,
        first_ts: ts,
        since: Some(ts),
        updated_ts: ts,
        resolved_ts: None,
        message: "connection closed without bye".into(),
        hint: None,
        evidence: Evidence::default(),
        attribution: None,
        peak: None,
        consequence_of: None,
    }
}

fn hold(f: &mut Findings, uid: u32, c: Finding) {
    f.closing(Some(uid));
    f.hold(c);
}

fn crashes(f: &Findings) -> u64 {
    f.totals()
        .find(|(k, _)| *k == Kind::Crash)
        .map_or(0, |t| t.1)
}

#[test]
fn many_crashes_of_one_job_fold_into_one_finding_that_counts_them() {
    let mut f = Findings::default();
    for i in 0..PER_JOB as u64 {
        hold(&mut f, 5, crash(i, "train", 10.0 + i as f64));
    }
    assert_eq!(f.held().count(), PER_JOB, "a few crashes are held one each");
    for i in PER_JOB as u64..1000 {
        hold(&mut f, 5, crash(i, "train", 10.0 + i as f64));
    }
    // Another user's job of the same name is not folded in.
    hold(&mut f, 6, crash(1000, "train", 1010.0));
    let held: Vec<_> = f.held().collect();
    assert_eq!(held.len(), 2);
    let agg = held.iter().find(|x| x.id == "crashes-1").unwrap();
    assert_eq!(agg.state, FindingState::Firing);
    assert_eq!(agg.severity, Severity::Critical);
    assert_eq!(agg.subject.job.as_deref(), Some("train"));
    assert_eq!(agg.subject.session, "s-999", "the latest");
    assert_eq!(agg.subject.rank, None);
    assert_eq!((agg.first_ts, agg.updated_ts), (10.0, 1009.0));
    assert!(
        agg.message
            .starts_with("1000 sessions of job train (uid 5) closed without bye in the last 999 s"),
        "{}",
        agg.message
    );
    assert_eq!(crashes(&f), 1001, "every crash counts once");
    // The findings it folded in are resolved, saying where they went.
    let folded: Vec<_> = f.recent().collect();
    assert_eq!(folded.len(), PER_JOB);
    assert!(folded
        .iter()
        .all(|x| x.message.ends_with("counted in crashes-1") && x.state == FindingState::Resolved));
    // The sinks got a bounded number of transitions, not one per crash.
    let posted = f.drain();
    assert!(posted.len() < 40, "{} posted", posted.len());
    assert_eq!(posted.last().unwrap().id, "s-1000/crash");
}

#[test]
fn the_aggregate_is_held_from_its_latest_crash() {
    let mut f = Findings::default();
    for i in 0..=PER_JOB as u64 {
        hold(&mut f, 0, crash(i, "j", 0.0));
    }
    hold(&mut f, 0, crash(99, "j", 50.0));
    f.tick(100.0, 60.0);
    assert_eq!(
        f.held().count(),
        1,
        "60 s from the latest crash, not the first"
    );
    f.tick(110.0, 60.0);
    assert_eq!(f.held().count(), 0);
    let last = f.recent().last().unwrap();
    assert_eq!(last.id, "crashes-1");
    assert_eq!(last.state, FindingState::Resolved);
    assert!(last
        .message
        .starts_with(&format!("{} sessions", PER_JOB + 2)));
    // A new burst raises a new aggregate.
    for i in 0..=PER_JOB as u64 {
        hold(&mut f, 0, crash(200 + i, "j", 120.0));
    }
    assert_eq!(f.held().next().unwrap().id, "crashes-2");
}

#[test]
fn past_the_cap_crashes_are_counted_per_uid() {
    let mut f = Findings::default();
    // Every session its own job: none folds by job.
    for i in 0..10_000u64 {
        hold(&mut f, 7, crash(i, &format!("job{i}"), 1.0));
    }
    assert_eq!(f.held().count(), HELD_MAX + 1);
    let agg = f.held().last().unwrap();
    assert_eq!(agg.subject.job, None);
    assert!(
        agg.message.starts_with(&format!(
            "{} sessions of uid 7 closed without bye",
            10_000 - HELD_MAX
        )),
        "{}",
        agg.message
    );
    assert_eq!(crashes(&f), 10_000);
    // Log lines: a burst, the rest counted.
    assert!(f.log_suppressed() >= (HELD_MAX as u64) - 20);
}

#[test]
fn a_restart_still_releases_a_crash_held_on_its_own() {
    let mut f = Findings::default();
    hold(&mut f, 0, crash(1, "j", 1.0));
    assert!(f.release("s-1/crash", 2.0, "restarted as s-2"));
    assert_eq!(f.held().count(), 0);
    assert!(!f.release("s-1/crash", 2.0, "again"));
}

/// A finding's `gpu` is a `u32` inside and a label value, a string, on the wire (metrics.md):
/// written as "3", read from "3" or 3, absent or null as none, and anything else refused by
/// name.
#[test]
fn a_finding_s_gpu_is_a_label_on_the_wire_and_an_index_inside() {
    let mut f = crash(1, "j", 100.0);
    f.gpu = Some(3);
    let v = serde_json::to_value(&f).unwrap();
    assert_eq!(v["gpu"], serde_json::json!("3"));
    assert_eq!(serde_json::from_value::<Finding>(v.clone()).unwrap(), f);
    let with = |gpu: serde_json::Value| {
        let mut v = v.clone();
        v["gpu"] = gpu;
        serde_json::from_value::<Finding>(v)
    };
    assert_eq!(with(serde_json::json!(3)).unwrap().gpu, Some(3));
    assert_eq!(with(serde_json::Value::Null).unwrap().gpu, None);
    let mut absent = v.clone();
    absent.as_object_mut().unwrap().remove("gpu");
    assert_eq!(serde_json::from_value::<Finding>(absent).unwrap().gpu, None);
    f.gpu = None;
    assert_eq!(
        serde_json::to_value(&f).unwrap()["gpu"],
        serde_json::Value::Null
    );
    let err = with(serde_json::json!("GPU-1")).unwrap_err().to_string();
    assert!(
        err.contains("\"GPU-1\"") && err.contains("not a GPU index"),
        "{err}"
    );
}

#[test]
fn consequences_fold_apart_from_the_cause_and_stay_warnings() {
    let mut f = Findings::default();
    // The cause: a critical crash of rank 0; then 12 ranks that followed it.
    hold(&mut f, 1000, crash(0, "llama", 100.0));
    let of = ConsequenceOf {
        session: "s-0".into(),
        rank: Some(0),
        kind: Kind::Crash,
        host: None,
    };
    for r in 1..13 {
        let mut c = crash(r, "llama", 101.0);
        c.severity = Severity::Warning;
        c.consequence_of = Some(of.clone());
        hold(&mut f, 1000, c);
    }
    let held: Vec<&Finding> = f.held().collect();
    let cause: Vec<_> = held
        .iter()
        .filter(|h| h.severity == Severity::Critical)
        .collect();
    assert_eq!(cause.len(), 1, "{held:#?}");
    assert_eq!(cause[0].id, "s-0/crash");
    // The followers folded into one warning past PER_JOB, never the cause.
    assert!(held
        .iter()
        .any(|h| h.id.starts_with("crashes-") && h.severity == Severity::Warning));
    assert!(held.len() <= PER_JOB + 2, "{}", held.len());
}

#[test]
fn relabel_makes_an_overturned_cause_a_warning_and_posts_it() {
    let mut f = Findings::default();
    hold(&mut f, 1000, crash(3, "llama", 101.0));
    f.drain();
    let of = ConsequenceOf {
        session: "s-5".into(),
        rank: Some(5),
        kind: Kind::Oom,
        host: None,
    };
    f.relabel("s-3", &of, 102.0);
    let h = f.held().next().unwrap();
    assert_eq!(h.severity, Severity::Warning);
    assert_eq!(h.consequence_of.as_ref(), Some(&of));
    assert!(
        h.message.ends_with("; after rank 5's oom (s-5)"),
        "{}",
        h.message
    );
    assert_eq!(f.drain().len(), 1);
}

#[test]
fn stops_fold_apart_from_crashes_and_say_they_were_stopped() {
    let mut f = Findings::default();
    // One unexplained crash of the job, then a scancel of 20 ranks.
    hold(&mut f, 1000, crash(0, "llama", 100.0));
    for r in 1..21 {
        let mut s = crash(r, "llama", 101.0);
        s.id = format!("s-{r}/stopped");
        s.kind = Kind::Stopped;
        s.severity = Severity::Warning;
        hold(&mut f, 1000, s);
    }
    let held: Vec<&Finding> = f.held().collect();
    let crashes: Vec<_> = held.iter().filter(|h| h.kind == Kind::Crash).collect();
    assert_eq!(crashes.len(), 1, "{held:#?}");
    assert_eq!(crashes[0].severity, Severity::Critical);
    let folded: Vec<_> = held
        .iter()
        .filter(|h| h.id.starts_with("crashes-"))
        .collect();
    assert_eq!(folded.len(), 1, "{held:#?}");
    assert_eq!(
        (folded[0].kind, folded[0].severity),
        (Kind::Stopped, Severity::Warning)
    );
    assert!(
        folded[0].message.contains("were stopped by a signal"),
        "{}",
        folded[0].message
    );
    assert!(held.len() <= PER_JOB + 2, "{}", held.len());
}
