//! Two users' runs of one job name and run id, through the shipped rules on a real Prometheus
//! and the shipped Alertmanager example on a real Alertmanager: the other user opens (llama, 42)
//! first and crashes; root's rank 5 then runs out of memory and the other ranks follow. Each
//! run gets its own GpumonJobFailed naming its own first rank, and each job alert inhibits only
//! its own run's per-rank alerts (the daemon's, carrying `uid`), never the other user's.
//! Needs root (to connect as another uid) and the tools; elsewhere it says why and passes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod identity;
mod stack;
mod tools;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use identity::*;
use serde_json::Value;
use stack::alertmanager_with;
use stack::shipped::{example_for_test, label, rules_for_test, until};

const WAIT: Duration = Duration::from_secs(60);
/// Every rule's `for`, in seconds, in this test.
const FOR: u32 = 15;

#[test]
fn each_users_run_pages_for_its_own_first_rank_and_inhibits_only_its_own_alerts() {
    if !is_root() {
        return;
    }
    let Some(prometheus) = tools::find("prometheus", "prometheus") else {
        return;
    };
    let Some(am_bin) = tools::find("prometheus-alertmanager", "prometheus-alertmanager") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (hook, _received) = stack::webhook();
    let (am_proc, am) = alertmanager_with(&am_bin, dir.path(), &example_for_test(&hook), WAIT);
    let d = Daemon::start(DaemonOpts {
        args: DaemonOpts::default_args_and(vec!["--alertmanager-url".into(), am.clone()]),
        ..DaemonOpts::default()
    });
    let target = d.addr.to_string();
    let (prom_proc, prom) = stack::start_prometheus(
        &prometheus,
        dir.path(),
        &[&target],
        &rules_for_test(|_| FOR),
        am.trim_start_matches("http://"),
        stack::Scrape::Default,
    );
    let procs = [&am_proc, &prom_proc];

    let socket = d.socket.clone();
    let mut bait = as_uid(OTHER, move || connect(&socket, "llama", "42", 0, 4, ""));
    bait.steps(5);
    let mut root: Vec<Rank> = (0..4)
        .map(|r| connect(&d.socket, "llama", "42", r, 4, ""))
        .collect();
    for r in &mut root {
        r.steps(10);
    }
    let listed = || -> Result<Vec<Value>, String> {
        let (code, body) = stack::get(&format!("{am}/api/v2/alerts"), &[]);
        serde_json::from_str(&body).map_err(|_| format!("{code}: {body}"))
    };
    let find = |all: &[Value], name: &str, uid: &str| -> Option<Value> {
        all.iter()
            .find(|a| label(a, "alertname") == name && label(a, "uid") == uid)
            .cloned()
    };
    let other = OTHER.to_string();

    // Let a scrape see the live runs, then the bait crashes; its job alert reaches Alertmanager.
    std::thread::sleep(Duration::from_secs(2));
    drop(bait);
    until(
        WAIT,
        "the bait's job alert is in Alertmanager",
        &procs,
        || find(&listed()?, "GpumonJobFailed", &other).ok_or_else(|| "not yet".to_string()),
    );
    // Root's rank 1 runs out of memory and dies, and the other three are taken down after it.
    // The daemon pushes root's GpumonOOM at once; root's own job alert needs its `for`. Until
    // then the bait's job alert, of the same job name and run id, must not mute it.
    root[1].oom(unix_now());
    let early = until(WAIT, "root's GpumonOOM is in Alertmanager", &procs, || {
        let all = listed()?;
        find(&all, "GpumonOOM", "0")
            .map(|a| (a, find(&all, "GpumonJobFailed", "0").is_some()))
            .ok_or_else(|| "not yet".to_string())
    });
    assert!(
        !early.1,
        "root's job alert came before root's GpumonOOM was listed: the daemon's push took over {FOR} s"
    );
    assert_eq!(
        early.0["status"]["state"], "active",
        "the other user's job alert mutes root's OOM: {:#}",
        early.0
    );
    std::thread::sleep(Duration::from_millis(200));
    drop(root.remove(1));
    std::thread::sleep(Duration::from_millis(500));
    root.clear();

    // Prometheus: two job alerts, one per uid, each naming its own first rank.
    let alerts = until(WAIT, "two GpumonJobFailed fire", &procs, || {
        let (code, body) = stack::get(&format!("{prom}/api/v1/alerts"), &[]);
        let v: Value = serde_json::from_str(&body).map_err(|_| format!("{code}: {body}"))?;
        let firing: Vec<Value> = v["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| label(a, "alertname") == "GpumonJobFailed" && a["state"] == "firing")
            .collect();
        if firing.len() == 2 {
            Ok(firing)
        } else {
            Err(format!("{firing:#?}"))
        }
    });
    let by_uid: BTreeMap<String, &Value> = alerts
        .iter()
        .map(|a| (label(a, "uid").to_string(), a))
        .collect();
    let first = |uid: &str| {
        let a = by_uid
            .get(uid)
            .unwrap_or_else(|| panic!("no job alert of uid {uid}: {alerts:#?}"));
        let n = &a["annotations"];
        (
            label(a, "job_name").to_string(),
            label(a, "run_id").to_string(),
            n["first_rank"].as_str().unwrap_or("").to_string(),
            n["first_kind"].as_str().unwrap_or("").to_string(),
        )
    };
    let s = |x: &str| x.to_string();
    assert_eq!(
        first("0"),
        (s("llama"), s("42"), s("1"), s("oom")),
        "{alerts:#?}"
    );
    assert_eq!(
        first(&OTHER.to_string()),
        (s("llama"), s("42"), s("0"), s("crash")),
        "{alerts:#?}"
    );

    // Alertmanager: each job alert inhibits its own run's per-rank alerts and nothing of the
    // other user's.
    until(
        WAIT,
        "each run's per-rank alerts are inhibited by its own job alert",
        &procs,
        || {
            let listed = listed()?;
            let fp: BTreeMap<String, String> = listed
                .iter()
                .filter(|a| label(a, "alertname") == "GpumonJobFailed")
                .map(|a| {
                    (
                        label(a, "uid").to_string(),
                        a["fingerprint"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            if fp.len() != 2 {
                return Err(format!("job alerts in Alertmanager: {fp:?}"));
            }
            let rank_alerts: Vec<&Value> = listed
                .iter()
                .filter(|a| matches!(label(a, "alertname"), "GpumonOOM" | "GpumonTrainerCrash"))
                .collect();
            let root_oom = rank_alerts.iter().any(|a| {
                label(a, "alertname") == "GpumonOOM"
                    && label(a, "uid") == "0"
                    && label(a, "rank") == "1"
            });
            let bait_crash = rank_alerts
                .iter()
                .any(|a| label(a, "uid") == OTHER.to_string());
            if !root_oom || !bait_crash {
                return Err(format!("per-rank alerts so far: {rank_alerts:#?}"));
            }
            for a in &rank_alerts {
                let by: Vec<&str> = a["status"]["inhibitedBy"]
                    .as_array()
                    .map(|v| v.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let own = fp.get(label(a, "uid")).map(String::as_str);
                if a["status"]["state"] != "suppressed" || by != own.into_iter().collect::<Vec<_>>()
                {
                    return Err(format!(
                        "{a:#}\nwant inhibitedBy [{own:?}] only; job alerts {fp:?}"
                    ));
                }
            }
            Ok(())
        },
    );
    drop(d);
}
