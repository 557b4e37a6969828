//! A training run seen across nodes, with the shipped files run by the real tools.
//! - The Alertmanager example (dashboards/alertmanager/gpumon.alertmanager.yml): a run's
//!   GpumonJobFailed inhibits the per-rank failure alerts of the same (job_name, run_id), the
//!   daemon's own and Prometheus's alike, and nothing else: not another run of the same job, not
//!   another job with the same run_id, not a leak. The inhibited alerts are listed as suppressed
//!   and never reach a receiver. amtool accepts the file and routes as its comments say.
//! - The rules and the dashboard's Jobs row: a real Prometheus scraping two nodes (each serving a
//!   fixed gpumon_job_* exposition) with `honor_labels: false` written out raises one
//!   GpumonJobFailed naming the first rank, and the Jobs panels show the runs, the first failure
//!   and the ranks' peaks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod grafana;
mod stack;
mod tools;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpumon::core::detect::Kind;
use gpumon::outputs::alerts::alertmanager::alertname;
use serde_json::{json, Value};
use stack::alertmanager_with;
use stack::shipped::{example, example_for_test, label, rules_for_test, until, EXAMPLE, RULES};

/// Every wait of this test, each on its own.
const WAIT: Duration = Duration::from_secs(20);

fn post(am: &str, alerts: &[Value]) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .new_agent();
    let mut resp = agent
        .post(format!("{am}/api/v2/alerts"))
        .send_json(alerts)
        .unwrap();
    let body = resp.body_mut().read_to_string().unwrap_or_default();
    assert_eq!(resp.status().as_u16(), 200, "POST /api/v2/alerts: {body}");
}

fn listed(am: &str) -> Vec<Value> {
    let (code, body) = stack::get(&format!("{am}/api/v2/alerts"), &[]);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// alertname/job_name/run_id/rank: what tells the alerts of this test apart.
fn key(a: &Value) -> String {
    format!(
        "{}/{}/{}/{}",
        label(a, "alertname"),
        label(a, "job_name"),
        label(a, "run_id"),
        label(a, "rank")
    )
}

/// A firing alert as a gpumon daemon pushes it (src/outputs/alerts/alertmanager.rs): its labels,
/// with `instance` the daemon's host name.
fn daemon_alert(kind: Kind, severity: &str, job: &str, run_id: &str, rank: u32) -> Value {
    let host = if rank < 4 { "node-b" } else { "node-a" };
    let session = format!("s-{}", rank % 4 + 1);
    let kind_name = match kind {
        Kind::Oom => "oom",
        Kind::Crash => "crash",
        Kind::Leak => "leak",
        other => panic!("no label value for {other:?} in this test"),
    };
    json!({
        "labels": {
            "alertname": alertname(kind),
            "severity": severity,
            "kind": kind_name,
            "instance": host,
            "gpu": (rank % 4).to_string(),
            "uuid": format!("GPU-{host}-{}", rank % 4),
            "pid": (4000 + rank).to_string(),
            "job_name": job,
            "run_id": run_id,
            "rank": rank.to_string(),
            "session": session,
            "finding": format!("{session}/{kind_name}"),
        },
        "annotations": {"summary": format!("{kind_name} of {job} rank {rank}")},
        "generatorURL": format!("http://{host}:9477/api/v1/snapshot"),
    })
}

/// GpumonJobFailed as the shipped rule raises it: labels job_name, run_id and severity only.
fn job_failed(job: &str, run_id: &str) -> Value {
    json!({
        "labels": {"alertname": "GpumonJobFailed", "severity": "critical", "job_name": job, "run_id": run_id},
        "annotations": {
            "summary": format!("Job {job} (run {run_id}) failed: rank 5 (oom) on node-a:9477 first, 7 more ranks after it"),
            "first_rank": "5", "first_kind": "oom", "first_instance": "node-a:9477",
        },
        "generatorURL": "http://127.0.0.1:9090/graph",
    })
}

/// GpumonTrainerOOM as the shipped rule raises it for a trainer, with its session's run_id and
/// the scrape job.
fn prometheus_trainer_oom(job: &str, run_id: &str, rank: u32) -> Value {
    json!({
        "labels": {
            "alertname": "GpumonTrainerOOM", "severity": "critical", "instance": "node-a:9477",
            "gpu": (rank % 4).to_string(), "uuid": format!("GPU-node-a-{}", rank % 4),
            "pid": (4000 + rank).to_string(), "job": "gpumon", "job_name": job, "run_id": run_id,
            "rank": rank.to_string(),
        },
        "annotations": {"summary": format!("CUDA out of memory on node-a:9477: {job} rank {rank}")},
        "generatorURL": "http://127.0.0.1:9090/graph",
    })
}

#[test]
fn a_runs_job_alert_inhibits_its_rank_failures_and_nothing_else() {
    let Some(bin) = tools::find("prometheus-alertmanager", "prometheus-alertmanager") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (hook, received) = stack::webhook();
    let (am_proc, am) = alertmanager_with(&bin, dir.path(), &example_for_test(&hook), WAIT);

    // The job alert first, as the shipped route's group_wait arranges for real.
    post(&am, &[job_failed("llama", "r1")]);
    let source = until(
        WAIT,
        "Alertmanager lists GpumonJobFailed",
        &[&am_proc],
        || {
            listed(&am)
                .into_iter()
                .find(|a| label(a, "alertname") == "GpumonJobFailed")
                .filter(|a| a["status"]["state"] == "active")
                .ok_or_else(|| format!("{:#?}", listed(&am)))
        },
    );
    let source_fp = source["fingerprint"].as_str().unwrap().to_string();

    // Run r1 of llama: rank 5 on node-a ran out of memory first (the daemon's GpumonOOM and its
    // crash, both critical, and Prometheus's GpumonTrainerOOM); the 7 others crashed after it,
    // warnings naming it. Not inhibited: run r2 of llama, run r1 of another job, a leak of r1.
    let mut alerts = Vec::new();
    for rank in 0..8 {
        let sev = if rank == 5 { "critical" } else { "warning" };
        alerts.push(daemon_alert(Kind::Crash, sev, "llama", "r1", rank));
    }
    alerts.push(daemon_alert(Kind::Oom, "critical", "llama", "r1", 5));
    alerts.push(prometheus_trainer_oom("llama", "r1", 5));
    alerts.push(daemon_alert(Kind::Crash, "critical", "llama", "r2", 0));
    alerts.push(daemon_alert(Kind::Crash, "critical", "bert", "r1", 0));
    alerts.push(daemon_alert(Kind::Leak, "warning", "llama", "r1", 2));
    post(&am, &alerts);

    let crash = alertname(Kind::Crash);
    let mut want: BTreeMap<String, &str> = BTreeMap::new();
    for rank in 0..8 {
        want.insert(format!("{crash}/llama/r1/{rank}"), "suppressed");
    }
    want.insert(format!("{}/llama/r1/5", alertname(Kind::Oom)), "suppressed");
    want.insert("GpumonTrainerOOM/llama/r1/5".into(), "suppressed");
    want.insert(format!("{crash}/llama/r2/0"), "active");
    want.insert(format!("{crash}/bert/r1/0"), "active");
    want.insert(format!("{}/llama/r1/2", alertname(Kind::Leak)), "active");
    want.insert("GpumonJobFailed/llama/r1/".into(), "active");

    let got = until(
        WAIT,
        "every alert is listed, suppressed or active as expected",
        &[&am_proc],
        || {
            let now = listed(&am);
            let states: BTreeMap<String, &str> = now
                .iter()
                .map(|a| (key(a), a["status"]["state"].as_str().unwrap_or("?")))
                .collect();
            if states == want {
                Ok(now.clone())
            } else {
                Err(format!("want {want:#?}\ngot {states:#?}"))
            }
        },
    );
    for a in &got {
        let by: Vec<&str> = a["status"]["inhibitedBy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        if want[&key(a)] == "suppressed" {
            assert_eq!(by, [source_fp.as_str()], "{a}");
        } else {
            assert!(by.is_empty(), "{a}");
        }
        assert!(a["status"]["silencedBy"].as_array().unwrap().is_empty());
    }

    // The receivers: the job alert and the alerts not inhibited arrive; r1's rank failures, in
    // the same route with the same 1 s group_wait as r2's, never do.
    let delivered = |received: &Arc<Mutex<Vec<Value>>>| -> Vec<String> {
        received
            .lock()
            .unwrap()
            .iter()
            .flat_map(|b| b["alerts"].as_array().cloned().unwrap_or_default())
            .map(|a| key(&a))
            .collect()
    };
    until(
        WAIT,
        "the webhook gets what is not inhibited",
        &[&am_proc],
        || {
            let got = delivered(&received);
            let missing: Vec<&String> = want
                .iter()
                .filter(|(k, s)| **s == "active" && !got.contains(k))
                .map(|(k, _)| k)
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not delivered yet: {missing:?}; delivered {got:?}"))
            }
        },
    );
    // A few more group intervals for an inhibited alert to slip through, if it could.
    std::thread::sleep(Duration::from_secs(3));
    let got = delivered(&received);
    for k in &got {
        assert_eq!(
            want.get(k),
            Some(&"active"),
            "{k} reached a receiver; delivered: {got:?}"
        );
    }
}

/// amtool's standard output (its warnings go to standard error).
fn amtool(args: &[&str]) -> Option<String> {
    let bin = tools::find("amtool", "prometheus-alertmanager")?;
    let out = Command::new(bin).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "amtool {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout)
}

#[test]
fn the_example_passes_amtool_and_routes_as_it_says() {
    let Some(out) = amtool(&["check-config", EXAMPLE]) else {
        return;
    };
    assert!(out.contains("1 inhibit rules"), "{out}");
    let config = format!("--config.file={EXAMPLE}");
    let route = |labels: &[&str]| -> String {
        let mut args = vec!["config", "routes", "test", config.as_str()];
        args.extend_from_slice(labels);
        amtool(&args)
            .unwrap()
            .trim()
            .lines()
            .last()
            .unwrap()
            .to_string()
    };
    let oom = format!("alertname={}", alertname(Kind::Oom));
    let crash = format!("alertname={}", alertname(Kind::Crash));
    for (labels, receiver) in [
        (
            vec!["alertname=GpumonJobFailed", "severity=critical"],
            "pager",
        ),
        (vec![oom.as_str(), "severity=critical"], "pager"),
        (vec![crash.as_str(), "severity=warning"], "team"),
        (
            vec!["alertname=GpumonTrainerOOM", "severity=critical"],
            "pager",
        ),
        (vec!["alertname=GpumonLeak", "severity=warning"], "team"),
        (
            vec!["alertname=GpumonNvmlDown", "severity=critical"],
            "pager",
        ),
        (
            vec!["alertname=GpumonTargetDown", "severity=warning"],
            "team",
        ),
    ] {
        assert_eq!(route(&labels), receiver, "{labels:?}");
    }
}

/// The minutes of a `key: Nm` line in `block`.
fn minutes(block: &str, key: &str) -> u32 {
    block
        .lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|v| v.trim().strip_suffix('m'))
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no `{key} Nm` in:\n{block}"))
}

/// The per-rank failure alerts wait for the job alert that explains them: the example's
/// group_wait for them outlasts the rule's `for` plus a scrape and an evaluation; its inhibit
/// names exactly the alerts the daemon and the rules raise for a failed rank.
#[test]
fn the_example_waits_for_the_job_alert_and_inhibits_the_real_alert_names() {
    let am = example();
    let rules = std::fs::read_to_string(RULES).unwrap();
    let rule = rules
        .split("- alert: ")
        .find(|b| b.starts_with("GpumonJobFailed"))
        .expect("GpumonJobFailed in the rules");
    let route = am
        .split("- matchers:")
        .find(|b| {
            b.lines()
                .next()
                .is_some_and(|l| l.contains("GpumonTrainerCrash"))
        })
        .expect("the per-rank failure route");
    assert!(
        minutes(route, "group_wait:") >= minutes(rule, "for:") + 2,
        "route:\n{route}\nrule:\n{rule}"
    );
    let targets = format!(
        "target_matchers: ['alertname=~\"{}|{}|GpumonTrainerOOM\"']",
        alertname(Kind::Oom),
        alertname(Kind::Crash)
    );
    assert!(am.contains(&targets), "want {targets}");
    assert!(am.contains("source_matchers: [alertname=\"GpumonJobFailed\"]"));
    assert!(am.contains("equal: [job_name, run_id, uid]"));
    assert!(rules.contains("- alert: GpumonTrainerOOM"));
}

/// A node whose /metrics is `body`, to every request, until the test ends; its host:port.
fn fake_node(body: String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// When rank 5 of run r1 ran out of memory (Unix seconds).
const FIRST: f64 = 1_763_700_030.25;
const GIB: f64 = 1_073_741_824.0;

/// A node's gpumon_job_* and trainer series, as the daemon exposes them: ranks `ranks` of run r1
/// of llama failed (rank 5 by OOM first, the others crashed 1.1 to 1.5 s later); the same ranks
/// of run r2 run, each peaking at 40 GiB plus its rank in GiB.
fn node_metrics(ranks: std::ops::Range<u32>) -> String {
    let mut failed = String::from("# TYPE gpumon_job_rank_failed_timestamp_seconds gauge\n");
    let mut info = String::from("# TYPE gpumon_trainer_info gauge\n");
    let mut peak = String::from("# TYPE gpumon_trainer_allocated_peak_bytes gauge\n");
    for rank in ranks.clone() {
        let (kind, ts) = match rank {
            5 => ("oom", FIRST),
            r => ("crash", FIRST + 1.1 + f64::from(r % 5) / 10.0),
        };
        failed.push_str(&format!(
            "gpumon_job_rank_failed_timestamp_seconds{{job_name=\"llama\",run_id=\"r1\",rank=\"{rank}\",kind=\"{kind}\"}} {ts}\n"
        ));
        let (gpu, pid) = (rank % 4, 5000 + rank);
        info.push_str(&format!(
            "gpumon_trainer_info{{gpu=\"{gpu}\",uuid=\"GPU-{gpu}-{}\",pid=\"{pid}\",job_name=\"llama\",rank=\"{rank}\",session=\"s-{gpu}\",torch=\"2.5.1\",client=\"gpumon-py/0.1\",run_id=\"r2\"}} 1\n",
            ranks.start
        ));
        peak.push_str(&format!(
            "gpumon_trainer_allocated_peak_bytes{{gpu=\"{gpu}\",uuid=\"GPU-{gpu}-{}\",pid=\"{pid}\",job_name=\"llama\",rank=\"{rank}\"}} {}\n",
            ranks.start,
            (40.0 + f64::from(rank)) * GIB
        ));
    }
    format!(
        "# TYPE gpumon_job_info gauge\ngpumon_job_info{{job_name=\"llama\",run_id=\"r2\",world_size=\"8\"}} 1\n{failed}{info}{peak}"
    )
}

/// The one sample of a query, or an error naming what came back.
fn one(prom: &str, promql: &str) -> Result<Value, String> {
    let r = stack::query(prom, promql)?;
    match r.as_slice() {
        [s] => Ok(s.clone()),
        _ => Err(format!("{promql}: {r:?}")),
    }
}

#[test]
fn prometheus_finds_a_runs_first_failure_across_two_nodes_and_the_dashboard_shows_it() {
    let Some(prometheus) = tools::find("prometheus", "prometheus") else {
        return;
    };
    let Some(am_bin) = tools::find("prometheus-alertmanager", "prometheus-alertmanager") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (hook, received) = stack::webhook();
    let (am_proc, am) = alertmanager_with(&am_bin, dir.path(), &example_for_test(&hook), WAIT);
    // Ranks 0-3 on node b, 4-7 on node a.
    let node_a = fake_node(node_metrics(4..8));
    let node_b = fake_node(node_metrics(0..4));
    let (prom_proc, prom) = stack::start_prometheus(
        &prometheus,
        dir.path(),
        &[&node_a, &node_b],
        &rules_for_test(|minutes| minutes),
        am.trim_start_matches("http://"),
        stack::Scrape::HonorLabelsFalse,
    );
    let procs = [&am_proc, &prom_proc];

    // Prometheus: one alert for the run, naming rank 5 on node a.
    let alert = until(WAIT, "GpumonJobFailed fires in Prometheus", &procs, || {
        let (code, body) = stack::get(&format!("{prom}/api/v1/alerts"), &[]);
        let v: Value = serde_json::from_str(&body).map_err(|_| format!("{code}: {body}"))?;
        let alerts = v["data"]["alerts"].as_array().cloned().unwrap_or_default();
        match alerts.as_slice() {
            [a] if a["state"] == "firing" => Ok(a.clone()),
            _ => Err(format!("alerts: {alerts:#?}")),
        }
    });
    let labels: BTreeMap<String, String> = serde_json::from_value(alert["labels"].clone()).unwrap();
    let want: BTreeMap<String, String> = [
        ("alertname", "GpumonJobFailed"),
        ("job_name", "llama"),
        ("run_id", "r1"),
        ("severity", "critical"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(labels, want, "{alert:#}");
    let ann = &alert["annotations"];
    assert_eq!(
        (
            &ann["first_rank"],
            &ann["first_kind"],
            &ann["first_instance"]
        ),
        (&json!("5"), &json!("oom"), &json!(node_a)),
        "{alert:#}"
    );
    assert_eq!(
        ann["summary"],
        format!("Job llama (run r1) failed: rank 5 (oom) on {node_a} first, 7 more ranks after it")
    );
    let description = ann["description"].as_str().unwrap();
    assert!(
        description.contains("7 more ranks failed after it within 1.5 s"),
        "{description}"
    );
    assert_eq!(
        alert["value"].as_str().unwrap().parse::<f64>().unwrap(),
        FIRST,
        "{alert:#}"
    );

    // Alertmanager has it from Prometheus, and it inhibits the daemons' crash alerts of r1.
    until(
        WAIT,
        "Alertmanager has GpumonJobFailed from Prometheus",
        &procs,
        || {
            listed(&am)
                .into_iter()
                .find(|a| {
                    label(a, "alertname") == "GpumonJobFailed" && a["status"]["state"] == "active"
                })
                .ok_or_else(|| format!("{:#?}", listed(&am)))
        },
    );
    let crashes: Vec<Value> = (0..8)
        .filter(|r| *r != 5)
        .map(|r| daemon_alert(Kind::Crash, "warning", "llama", "r1", r))
        .collect();
    post(&am, &crashes);
    until(
        WAIT,
        "the daemons' crash alerts of r1 are suppressed",
        &procs,
        || {
            let states: Vec<String> = listed(&am)
                .iter()
                .filter(|a| label(a, "alertname") == alertname(Kind::Crash))
                .map(|a| a["status"]["state"].as_str().unwrap_or("?").to_string())
                .collect();
            if states.len() == 7 && states.iter().all(|s| s == "suppressed") {
                Ok(())
            } else {
                Err(format!("{states:?}"))
            }
        },
    );
    until(WAIT, "the webhook gets GpumonJobFailed", &procs, || {
        let bodies = received.lock().unwrap();
        let names: Vec<String> = bodies
            .iter()
            .flat_map(|b| b["alerts"].as_array().cloned().unwrap_or_default())
            .map(|a| label(&a, "alertname").to_string())
            .collect();
        if names.contains(&"GpumonJobFailed".to_string()) {
            assert!(
                !names.contains(&alertname(Kind::Crash).to_string()),
                "{names:?}"
            );
            Ok(())
        } else {
            Err(format!("{names:?}"))
        }
    });

    // The dashboard's Jobs row, as Grafana runs it with "All" selected.
    let dash = grafana::Dashboard::load();
    let q = |title: &str, r: &str| dash.query(title, r).promql.clone();
    let jobs = until(WAIT, "the Jobs table has the live run", &procs, || {
        one(&prom, &q("Jobs", "A"))
    });
    assert_eq!(
        (
            &jobs["metric"]["run_id"],
            &jobs["metric"]["world_size"],
            stack::value(&jobs)
        ),
        (&json!("r2"), &json!("8"), 2.0),
        "nodes of the run: {jobs}"
    );
    let live = one(&prom, &q("Jobs", "B")).unwrap();
    assert_eq!(stack::value(&live), 8.0, "live ranks: {live}");

    let first = one(&prom, &q("First failure per run", "A")).unwrap();
    let m = &first["metric"];
    assert_eq!(
        (
            &m["job_name"],
            &m["run_id"],
            &m["rank"],
            &m["kind"],
            &m["instance"]
        ),
        (
            &json!("llama"),
            &json!("r1"),
            &json!("5"),
            &json!("oom"),
            &json!(node_a)
        ),
        "{first}"
    );
    // `job` is the scrape job again, not renamed away or overwritten by the trainer's.
    assert_eq!(m["job"], "gpumon", "{first}");
    assert_eq!(stack::value(&first), FIRST * 1000.0);
    let failed = one(&prom, &q("First failure per run", "B")).unwrap();
    assert_eq!(stack::value(&failed), 8.0, "{failed}");
    let within = one(&prom, &q("First failure per run", "C")).unwrap();
    assert!((stack::value(&within) - 1.5).abs() < 1e-6, "{within}");

    let ranks = stack::query(&prom, &q("Rank peaks side by side", "A")).unwrap();
    let mut peaks: Vec<(String, f64)> = ranks
        .iter()
        .map(|s| {
            (
                s["metric"]["rank"].as_str().unwrap().to_string(),
                stack::value(s),
            )
        })
        .collect();
    peaks.sort_by(|a, b| a.0.cmp(&b.0));
    let want: Vec<(String, f64)> = (0..8)
        .map(|r| (r.to_string(), (40.0 + f64::from(r)) * GIB))
        .collect();
    assert_eq!(peaks, want);
    assert!(
        ranks.iter().all(|s| s["metric"]["run_id"] == "r2"),
        "{ranks:?}"
    );
    let spread = one(&prom, &q("Rank peak spread (highest − lowest)", "A")).unwrap();
    assert_eq!(stack::value(&spread), 7.0 * GIB, "{spread}");
    // The recorded spread, for Thanos or Mimir users, agrees.
    let recorded = until(WAIT, "the spread is recorded", &procs, || {
        one(
            &prom,
            "job_name_run_id:gpumon_trainer_allocated_peak_bytes:spread",
        )
    });
    assert_eq!(stack::value(&recorded), 7.0 * GIB, "{recorded}");
}
