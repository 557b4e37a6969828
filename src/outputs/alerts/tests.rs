use std::sync::{Arc, Mutex};

use super::*;
use crate::core::detect::attribution::{kept_outputs_example, Attribution};
use crate::core::detect::findings::{Severity, Subject};
use crate::core::detect::{Evidence, Kind};
use crate::util::health::Health;

struct Flaky {
    fail: Arc<Mutex<u32>>,
    got: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Sink for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn wants_resend(&self) -> bool {
        true
    }
    fn send(&self, batch: &[Finding]) -> Result<(), String> {
        let mut f = self.fail.lock().unwrap();
        if *f > 0 {
            *f -= 1;
            return Err("down".into());
        }
        self.got.lock().unwrap().push(
            batch
                .iter()
                .map(|f| format!("{}:{:?}", f.id, f.state))
                .collect(),
        );
        Ok(())
    }
}

fn finding(id: &str, state: FindingState) -> Finding {
    Finding {
        id: id.into(),
        kind: Kind::Leak,
        state,
        severity: Severity::Warning,
        subject: Subject::default(),
        gpu: None,
        first_step: None,
        first_ts: 1.0,
        since: Some(1.0),
        updated_ts: 1.0,
        resolved_ts: None,
        message: "m".into(),
        hint: None,
        evidence: Evidence::default(),
        attribution: None,
        peak: None,
        consequence_of: None,
    }
}

#[test]
fn a_down_receiver_gets_the_latest_state_per_finding_after_backoff() {
    let fail = Arc::new(Mutex::new(2));
    let got = Arc::new(Mutex::new(Vec::new()));
    let stats = Arc::new(AlertStats::new(&["flaky"]));
    let mut q = Queue::new(
        Box::new(Flaky {
            fail: fail.clone(),
            got: got.clone(),
        }),
        stats.clone(),
    );
    let t0 = Instant::now();
    q.push(&finding("s-1/leak", FindingState::Firing));
    q.push(&finding("s-1/leak#pending", FindingState::Pending));
    q.deliver(t0);
    assert!(got.lock().unwrap().is_empty());
    // Backing off: no retry before a second has passed.
    q.deliver(t0 + Duration::from_millis(500));
    assert_eq!(*fail.lock().unwrap(), 1);
    q.push(&finding("s-1/leak", FindingState::Resolved));
    q.push(&finding("s-2/leak", FindingState::Firing));
    q.deliver(t0 + Duration::from_secs(1));
    assert_eq!(*fail.lock().unwrap(), 0);
    // The second failure doubled the backoff to 2 s.
    q.deliver(t0 + Duration::from_millis(2500));
    assert!(got.lock().unwrap().is_empty());
    q.deliver(t0 + Duration::from_secs(4));
    assert_eq!(
        *got.lock().unwrap(),
        vec![vec![
            "s-1/leak:Resolved".to_string(),
            "s-2/leak:Firing".to_string()
        ]]
    );
    let sink = stats.sink("flaky").unwrap();
    assert_eq!(sink.failures.load(Ordering::Relaxed), 2);
    assert_eq!(sink.deliveries.load(Ordering::Relaxed), 1);
}

#[test]
fn the_queue_is_bounded_dropping_the_stalest() {
    let stats = Arc::new(AlertStats::new(&["flaky"]));
    let mut q = Queue::new(
        Box::new(Flaky {
            fail: Arc::new(Mutex::new(u32::MAX)),
            got: Arc::new(Mutex::new(Vec::new())),
        }),
        stats.clone(),
    );
    for i in 0..QUEUE + 50 {
        q.push(&finding(&format!("s-{i}/leak"), FindingState::Firing));
    }
    assert_eq!(q.pending.len(), QUEUE);
    // What was dropped is what the exported counter says.
    assert_eq!(
        stats.sink("flaky").unwrap().dropped.load(Ordering::Relaxed),
        50
    );
    assert!(!q.pending.contains_key("s-0/leak"));
    assert!(q.pending.contains_key(&format!("s-{}/leak", QUEUE + 49)));
}

#[test]
fn alertmanager_alerts_carry_the_contract_labels_and_times() {
    let mut f = finding("s-3/leak", FindingState::Resolved);
    f.subject = Subject {
        session: "s-3".into(),
        job: Some("llama".into()),
        run_id: None,
        uid: Some(1000),
        rank: Some(1),
        pid: 4242,
        ns_pid: Some(7),
        gpu_uuid: Some("GPU-1".into()),
    };
    f.gpu = Some(0);
    f.resolved_ts = Some(1_763_700_000.0);
    let a = alertmanager::alert(&f, "node1", "http://x/api", 240.0);
    let l = &a["labels"];
    for (k, v) in [
        ("alertname", "GpumonLeak"),
        ("severity", "warning"),
        ("gpu", "0"),
        ("uuid", "GPU-1"),
        ("pid", "4242"),
        ("job_name", "llama"),
        ("uid", "1000"),
        ("rank", "1"),
        ("instance", "node1"),
    ] {
        assert_eq!(l[k], v, "{k}");
    }
    // `job` is the scrape job on Prometheus's alerts; the shipped routing and inhibit match on
    // job_name, which both senders carry.
    assert!(l.get("job").is_none(), "{l}");
    assert_eq!(a["endsAt"], "2025-11-21T04:40:00.000Z");
    assert_eq!(a["startsAt"], "1970-01-01T00:00:01.000Z");
}

/// A trainer's strings reach Alertmanager (and the people reading it) escaped; the webhook's
/// JSON keeps the true value.
#[test]
fn alertmanager_alerts_carry_a_trainer_s_strings_escaped() {
    let mut f = finding("s-4/leak", FindingState::Firing);
    f.subject.job = Some("evil\x1b[2J\x1b]0;pwned\x07".into());
    f.message = "job evil\x1b[2J grows".into();
    let a = alertmanager::alert(&f, "node1", "http://x/api", 240.0);
    let text = a.to_string();
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text}"
    );
    assert!(
        a["labels"]["job_name"]
            .as_str()
            .unwrap()
            .starts_with("evil\\u{1b}[2J"),
        "{}",
        a["labels"]["job_name"]
    );
    assert!(a["annotations"]["summary"]
        .as_str()
        .unwrap()
        .contains("\\u{1b}[2J"));
    let body = webhook::body("node1", std::slice::from_ref(&f));
    assert!(body.to_string().contains("\\u001b[2J"), "{body}");
}

#[test]
fn an_attributed_leak_alert_names_the_top_site_and_its_stack() {
    let mut f = finding("s-3/leak", FindingState::Firing);
    let plain = alertmanager::alert(&f, "node1", "http://x/api", 240.0);
    let keys: Vec<&String> = plain["annotations"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["description", "summary"]);

    f.attribution = Some(kept_outputs_example());
    let a = alertmanager::alert(&f, "node1", "http://x/api", 240.0);
    assert_eq!(
        a["annotations"]["attribution"],
        "train.py:27 in kept_outputs (100% of 120.0 MiB in steps 60\u{2013}180)"
    );
    assert_eq!(
        a["annotations"]["attribution_stack"],
        "/home/alice/proj/train.py:27 in kept_outputs\n\
         /home/alice/proj/train.py:48 in run\n\
         /home/alice/proj/train.py:69 in <module>"
    );
    // Labels stay as they were: a new attribution changes the alert, not its identity.
    assert_eq!(a["labels"], plain["labels"]);

    let mut failed = kept_outputs_example();
    failed.sites.clear();
    failed.error = Some("unavailable".into());
    failed.detail = Some("torch.cuda is not available".into());
    f.attribution = Some(failed);
    let a = alertmanager::alert(&f, "node1", "http://x/api", 240.0);
    assert_eq!(
        a["annotations"]["attribution"],
        "attribution unavailable: torch.cuda is not available"
    );
    assert!(a["annotations"].get("attribution_stack").is_none(), "{a}");
}

#[test]
fn the_webhook_body_carries_the_whole_attribution() {
    let mut f = finding("s-3/leak", FindingState::Firing);
    f.attribution = Some(kept_outputs_example());
    let body = webhook::body("node1", &[f, finding("s-4/leak", FindingState::Resolved)]);
    assert_eq!(body["host"], "node1");
    let a = &body["findings"][0]["attribution"];
    assert_eq!(a["total_growth_bytes"], 125_829_120);
    assert_eq!(
        (a["step_from"].as_u64(), a["step_to"].as_u64()),
        (Some(60), Some(180))
    );
    let site = &a["sites"][0];
    assert_eq!(
        (&site["file"], &site["line"], &site["function"]),
        (
            &"/home/alice/proj/train.py".into(),
            &27.into(),
            &"kept_outputs".into()
        )
    );
    assert_eq!(
        (site["bytes"].as_u64(), site["blocks"].as_u64()),
        (Some(125_829_120), Some(120))
    );
    assert_eq!(site["stack"][1]["function"], "run");
    // The round trip gives back what was sent.
    let back: Attribution = serde_json::from_value(a.clone()).unwrap();
    assert_eq!(back, kept_outputs_example());
    // A finding without one carries no key at all.
    assert!(body["findings"][1].get("attribution").is_none());
}

/// Panics on its first delivery, then records what it gets.
struct PanicsOnce {
    panicked: Arc<Mutex<bool>>,
    got: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Sink for PanicsOnce {
    fn name(&self) -> &'static str {
        "panicky"
    }
    fn wants_resend(&self) -> bool {
        false
    }
    fn send(&self, batch: &[Finding]) -> Result<(), String> {
        let mut p = self.panicked.lock().unwrap();
        if !*p {
            *p = true;
            drop(p);
            panic!("a sink bug");
        }
        self.got
            .lock()
            .unwrap()
            .push(batch.iter().map(|f| f.id.clone()).collect());
        Ok(())
    }
}

#[test]
fn the_alert_thread_survives_a_panicking_sink_and_counts_it() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let mut alerts = spawn_sinks(
        vec![Box::new(PanicsOnce {
            panicked: Arc::new(Mutex::new(false)),
            got: got.clone(),
        })],
        Duration::from_secs(3600),
    )
    .unwrap();
    let tx = alerts.transitions.take().unwrap();
    tx.send(finding("s-1/leak", FindingState::Firing)).unwrap();
    // The first delivery panics; the retry after the 1 s backoff delivers the same state.
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "never delivered after the panic");
        std::thread::sleep(Duration::from_millis(50));
    }
    let sink = alerts.stats.sink("panicky").unwrap();
    assert_eq!(sink.panics.load(Ordering::Relaxed), 1);
    assert_eq!(sink.failures.load(Ordering::Relaxed), 1);
    assert_eq!(*got.lock().unwrap(), vec![vec!["s-1/leak".to_string()]]);
    // Still alive: a later transition goes out too, and closing the channel ends the thread.
    tx.send(finding("s-2/leak", FindingState::Firing)).unwrap();
    drop(tx);
    alerts.thread.join().unwrap();
    assert_eq!(got.lock().unwrap().len(), 2);
}

struct Slow;

impl Sink for Slow {
    fn name(&self) -> &'static str {
        "slow"
    }
    fn wants_resend(&self) -> bool {
        false
    }
    fn send(&self, _: &[Finding]) -> Result<(), String> {
        std::thread::sleep(Duration::from_millis(40));
        Err("timed out".into())
    }
}

#[test]
fn a_sinks_delivery_time_is_counted_failures_included() {
    let stats = Arc::new(AlertStats::new(&["slow"]));
    let mut q = Queue::new(Box::new(Slow), stats.clone());
    q.push(&finding("s-1/leak", FindingState::Firing));
    let t0 = Instant::now();
    q.deliver(t0);
    q.deliver(t0 + Duration::from_secs(2));
    let s = stats.sink("slow").unwrap();
    assert_eq!(s.failures.load(Ordering::Relaxed), 2);
    let busy = s.busy_ns.load(Ordering::Relaxed);
    let last = s.last_ns.load(Ordering::Relaxed);
    assert!((80_000_000..2_000_000_000).contains(&busy), "{busy}");
    assert!(last >= 40_000_000 && last <= busy - 40_000_000, "{last}");
    let mut text = String::new();
    stats.families(&mut text);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{sink=\"slow\"}} ")))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let total = value("gpumon_alert_delivery_seconds_total").unwrap();
    assert!((total - busy as f64 / 1e9).abs() < 1e-9, "{text}");
    let last_s = value("gpumon_alert_last_delivery_duration_seconds").unwrap();
    assert!((last_s - last as f64 / 1e9).abs() < 1e-9, "{text}");
}

#[test]
fn a_near_limit_with_a_step_peak_names_its_top_site_in_both_sinks() {
    use crate::core::detect::peak::{attention_example, Peak};
    let mut f = finding("s-3/near_limit", FindingState::Firing);
    f.kind = Kind::NearLimit;
    let plain = alertmanager::alert(&f, "node1", "http://x/api", 240.0);
    assert!(
        plain["annotations"].get("peak_top_site").is_none(),
        "{plain}"
    );
    f.peak = Some(attention_example());
    let a = alertmanager::alert(&f, "node1", "http://x/api", 240.0);
    assert_eq!(
        a["annotations"]["peak_top_site"],
        "model.py:88 in attention (50% of the 4.0 GiB peak in steps 1,210\u{2013}1,230)"
    );
    let body = webhook::body("node1", std::slice::from_ref(&f));
    let p = &body["findings"][0]["peak"];
    assert_eq!(p["sites"][0]["line"], 88);
    assert_eq!(p["peak_bytes"].as_u64(), Some(4 << 30));
    let back: Peak = serde_json::from_value(p.clone()).unwrap();
    assert_eq!(back, attention_example());
}

#[test]
fn a_consequence_says_what_it_followed_as_its_message_does() {
    let mut f = finding("s-3/crash", FindingState::Firing);
    f.kind = Kind::Crash;
    f.severity = Severity::Critical;
    f.subject.session = "s-3".into();
    let of = crate::core::detect::findings::ConsequenceOf {
        session: "s-5".into(),
        rank: Some(5),
        kind: Kind::Oom,
        host: None,
    };
    f.transition(crate::core::detect::findings::Transition::ConsequenceOf { of: &of, at: 2.0 });
    let a = alertmanager::alert(&f, "node1", "http://x/api", 240.0);
    assert_eq!(a["annotations"]["consequence_of"], "rank 5's oom (s-5)");
    assert_eq!(a["annotations"]["summary"], "m; after rank 5's oom (s-5)");
    assert_eq!(a["labels"]["severity"], "warning");
}
