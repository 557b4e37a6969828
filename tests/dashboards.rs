//! The Grafana dashboard and the Prometheus alert rules: promtool checks and unit-tests the
//! rules, every dashboard query is valid PromQL, and every gpumon_* name they use is one the
//! daemon emits or docs/metrics.md lists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod grafana;
mod tools;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::Daemon;
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards");
const RULES: &str = "prometheus/gpumon.rules.yml";
const RULE_TESTS: &str = "prometheus/gpumon.rules.test.yml";
const DASHBOARD: &str = "gpumon-gpu-memory.json";
fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(DIR).join(rel)).unwrap()
}

fn promtool(args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    if tools::find("promtool", "prometheus").is_none() {
        return;
    }
    let dir = Path::new(DIR);
    let (ok, out) = promtool(&["check", "rules", RULES], dir);
    assert!(ok, "{out}");
    let (ok, out) = promtool(&["test", "rules", RULE_TESTS], dir);
    assert!(ok, "{out}");
}

/// (alert name, its block of lines) for each rule in the rules file.
fn alerts(rules: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in rules.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix("- alert:") {
            out.push((name.trim().to_string(), String::new()));
        } else if t.starts_with("- name:") {
            out.push((String::new(), String::new()));
        } else if let Some((_, block)) = out.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    out.retain(|(n, _)| !n.is_empty());
    out
}

/// docs/operations.md lists every alert of the rules file with its severity and `for`, as the
/// rules say them (GpumonJobFailed was once left out).
#[test]
fn operations_md_lists_every_alert_with_its_severity_and_for() {
    let ops = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let section = ops
        .split("\n## Alerts\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap();
    let field = |block: &str, key: &str| -> String {
        block
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let rules = read(RULES);
    let alerts = alerts(&rules);
    assert!(alerts.iter().any(|(n, _)| n == "GpumonJobFailed"));
    for (name, block) in &alerts {
        let row = format!(
            "| {name} | {} | {} |",
            field(block, "severity:"),
            field(block, "for:")
        );
        assert!(
            section.contains(&row),
            "docs/operations.md, Alerts, lacks {row}"
        );
    }
}

#[test]
fn every_alert_is_labelled_annotated_and_tested_firing_and_quiet() {
    let rules = read(RULES);
    let alerts = alerts(&rules);
    let names: Vec<&str> = alerts.iter().map(|(n, _)| n.as_str()).collect();
    for wanted in [
        "GpumonLeakSuspected",
        "GpumonOOMForecast",
        "GpumonNearLimit",
        "GpumonTrainerOOM",
        "GpumonNvmlDown",
        "GpumonTargetDown",
    ] {
        assert!(names.contains(&wanted), "no alert {wanted} in {names:?}");
    }
    for (name, block) in &alerts {
        let sev = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("severity:"))
            .map(str::trim);
        assert!(
            matches!(sev, Some("warning" | "critical")),
            "{name}: severity {sev:?}"
        );
        for key in ["summary:", "description:", "runbook:"] {
            assert!(
                block.lines().any(|l| l.trim().starts_with(key)),
                "{name} has no {key}"
            );
        }
    }
    // In the unit tests, each alert must be expected both firing and not firing somewhere.
    let tests = read(RULE_TESTS);
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(name) = l.strip_prefix("alertname:") else {
            continue;
        };
        let next = lines[i + 1..].iter().find(|l| !l.is_empty()).unwrap();
        match *next {
            "exp_alerts: []" => quiet.insert(name.trim()),
            "exp_alerts:" => firing.insert(name.trim()),
            other => panic!("unexpected line after alertname {name}: {other}"),
        };
    }
    for name in &names {
        assert!(firing.contains(name), "{name} is never tested firing");
        assert!(quiet.contains(name), "{name} is never tested quiet");
    }
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).unwrap()
}

/// Every panel, rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// (panel title, expr) of every query in the dashboard.
fn exprs(d: &Value) -> Vec<(String, String)> {
    panels(d)
        .iter()
        .filter_map(|p| p["targets"].as_array().map(|t| (p, t)))
        .flat_map(|(p, targets)| {
            targets.iter().map(|t| {
                (
                    p["title"].as_str().unwrap_or("?").to_string(),
                    t["expr"].as_str().unwrap_or("").to_string(),
                )
            })
        })
        .collect()
}

fn is_datasource_var(v: &Value) -> bool {
    v["uid"] == "${datasource}" && v["type"] == "prometheus"
}

#[test]
fn dashboard_is_importable_with_a_datasource_variable_and_sane_panels() {
    let d = dashboard();
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(d["title"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(
        d["id"].is_null(),
        "a fixed id clashes with existing dashboards"
    );
    let vars = d["templating"]["list"].as_array().unwrap();
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no template variable {name}"))
    };
    let ds = var("datasource");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    for name in ["instance", "gpu", "job_name"] {
        let v = var(name);
        assert_eq!(v["type"], "query", "{name}");
        assert!(is_datasource_var(&v["datasource"]), "{name}");
        assert_eq!(
            v["allValue"], ".*",
            "{name}: All must match empty labels too"
        );
    }

    let mut ids = BTreeSet::new();
    let mut boxes: Vec<(String, [i64; 4])> = Vec::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or("").to_string();
        assert!(!title.is_empty(), "a panel without title: {p}");
        assert!(
            ids.insert(p["id"].as_i64().unwrap()),
            "duplicate id in {title}"
        );
        let g = &p["gridPos"];
        let b = ["x", "y", "w", "h"].map(|k| g[k].as_i64().unwrap());
        assert!(b[0] >= 0 && b[2] >= 1 && b[0] + b[2] <= 24, "{title}: {g}");
        for (other, o) in &boxes {
            let overlap = b[0] < o[0] + o[2]
                && o[0] < b[0] + b[2]
                && b[1] < o[1] + o[3]
                && o[1] < b[1] + b[3];
            assert!(!overlap, "{title} overlaps {other}");
        }
        boxes.push((title.clone(), b));
        if p["type"] == "row" {
            continue;
        }
        assert!(
            is_datasource_var(&p["datasource"]),
            "{title}: {}",
            p["datasource"]
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(is_datasource_var(&t["datasource"]), "{title}");
            assert!(refs.insert(t["refId"].as_str().unwrap()), "{title}: refId");
            assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()));
        }
    }
    assert!(exprs(&d).len() >= 30, "the dashboard lost queries");
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    if tools::find("promtool", "prometheus").is_none() {
        return;
    }
    let d = dashboard();
    let vars: BTreeSet<String> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    // promtool parses PromQL only inside rule files: one recording rule per query.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, expr)) in exprs(&d).iter().enumerate() {
        let e = serde_json::to_string(&grafana::substituted(expr, &vars)).unwrap();
        rules.push_str(&format!("      - record: q{i}\n        expr: {e}\n"));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("q.yml"), &rules).unwrap();
    let (ok, out) = promtool(&["check", "rules", "q.yml"], dir.path());
    assert!(ok, "{out}\n{rules}");

    // The check catches a broken query, or it proves nothing.
    std::fs::write(
        dir.path().join("bad.yml"),
        "groups:\n  - name: b\n    rules:\n      - record: q\n        expr: \"sum by (gpu gpumon_gpu_up\"\n",
    )
    .unwrap();
    assert!(!promtool(&["check", "rules", "bad.yml"], dir.path()).0);
}

/// gpumon_* names in a text.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("gpumon_") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// Names on a real daemon's /metrics (fake NVML, one trainer session pushing).
fn emitted_names() -> BTreeSet<String> {
    // The test process is the trainer, listed by the fake NVML on GPU 0, so that its memory
    // ledger (gpumon_trainer_outside_allocator_bytes) is known.
    let dir = tempfile::tempdir().unwrap();
    let mut scen = std::fs::read_to_string(common::scenario("two_gpus")).unwrap();
    scen = scen.replacen(
        "[[gpu.process]]",
        &format!(
            "[[gpu.process]]\npid = {}\nname = \"python\"\nused = 1073741824\n\n[[gpu.process]]",
            std::process::id()
        ),
        1,
    );
    let path = dir.path().join("with_me.toml");
    std::fs::write(&path, scen).unwrap();
    let d = Daemon::start(common::DaemonOpts {
        scenario: Some(&path),
        ..common::DaemonOpts::default()
    });
    let s = UnixStream::connect(&d.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    w.write_all(
        b"{\"type\":\"hello\",\"v\":1,\"job\":\"j\",\"rank\":0,\"gpu_uuid\":\"GPU-11111111-2222-3333-4444-555555555555\"}\n\
          {\"type\":\"sample\",\"ts\":1763700000,\"step\":1,\"stats\":{\"allocated_bytes.all.current\":1,\"allocated_bytes.all.peak\":2,\"reserved_bytes.all.current\":4,\"active_bytes.all.current\":1,\"inactive_split_bytes.all.current\":1}}\n\
          {\"type\":\"sample\",\"ts\":1763700001,\"step\":3,\"stats\":{\"allocated_bytes.all.current\":600,\"allocated_bytes.all.peak\":1000,\"reserved_bytes.all.current\":1100,\"active_bytes.all.current\":600,\"inactive_split_bytes.all.current\":10},\"device_free\":900,\"device_total\":2200,\"categories\":{\"step\":3,\"parameters_bytes\":100,\"gradients_bytes\":100,\"optimizer_state_bytes\":200,\"buffers_bytes\":10,\"activations_bytes\":400,\"batch_size\":8}}\n",
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.contains("welcome"), "{line}");
    let mut metrics = String::new();
    // The second sample carries the memory split (gpumon_trainer_memory_bytes and the fit).
    d.wait_for(Duration::from_secs(5), "the trainer's samples", || {
        metrics = d.metrics();
        metrics.contains("gpumon_trainer_largest_safe_batch{")
    });
    if tools::find("promtool", "prometheus").is_some() {
        common::promtool_check(&metrics);
    }
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_metric_the_dashboard_and_rules_use_exists() {
    let documented = metric_names(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap(),
    );
    let emitted = emitted_names();
    // The fixture must reach the families the dashboard leans on, or the comparison is hollow.
    for n in [
        "gpumon_gpu_memory_used_bytes",
        "gpumon_process_info",
        "gpumon_trainer_allocated_bytes",
        "gpumon_ingest_rejected_total",
        "gpumon_trainer_memory_bytes",
        "gpumon_trainer_largest_safe_batch",
    ] {
        assert!(
            emitted.contains(n),
            "the daemon did not emit {n}: {emitted:?}"
        );
    }
    let known: BTreeSet<&String> = documented.union(&emitted).collect();

    let d = dashboard();
    let mut used = BTreeSet::new();
    for (title, expr) in exprs(&d) {
        for n in metric_names(&expr) {
            assert!(
                known.contains(&n),
                "panel {title:?} uses unknown metric {n}"
            );
            used.insert(n);
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        for n in metric_names(v["definition"].as_str().unwrap_or("")) {
            assert!(
                known.contains(&n),
                "variable {} uses unknown {n}",
                v["name"]
            );
        }
    }
    for n in metric_names(&read(RULES)) {
        assert!(known.contains(&n), "alert rules use unknown metric {n}");
        used.insert(n);
    }
    println!(
        "{} gpumon metrics used by the dashboard and rules, of {} documented or emitted",
        used.len(),
        known.len()
    );
    // A typo in the extraction would make the loop above pass vacuously.
    assert!(used.contains("gpumon_trainer_allocated_bytes") && used.len() >= 20);
}

/// The panels of where the memory goes: the bar chart's categories are the metric's (docs/metrics.md),
/// and the table reads the largest safe batch beside the batch now, for the dashboard's trainers.
#[test]
fn the_memory_split_panels_read_the_split_and_the_fit() {
    let d = dashboard();
    let all = panels(&d);
    let panel = |title: &str| {
        *all.iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("no panel {title:?}"))
    };
    let exprs_of = |p: &Value| -> Vec<String> {
        p["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["expr"].as_str().unwrap().to_string())
            .collect()
    };
    let trainers = "{instance=~\"$instance\", gpu=~\"$gpu\", job_name=~\"$job_name\"}";

    let split = panel("Where the memory goes");
    let e = exprs_of(split);
    assert_eq!(e.len(), 1);
    assert!(
        e[0].contains(&format!("gpumon_trainer_memory_bytes{trainers}")),
        "{e:?}"
    );
    assert_eq!(split["options"]["stacking"], "normal");
    let matrix = &split["transformations"][0];
    assert_eq!(matrix["id"], "groupingToMatrix");
    assert_eq!(matrix["options"]["columnField"], "category");
    // Every label the trainer name is joined from is on the metric.
    let trainer = matrix["options"]["rowField"].as_str().unwrap();
    assert!(e[0].contains(&format!("\"{trainer}\"")), "{e:?}");
    let order = split["transformations"][1]["options"]["indexByName"]
        .as_object()
        .unwrap();
    let mut categories: Vec<(&String, i64)> = order
        .iter()
        .filter(|(k, _)| !k.contains('\\'))
        .map(|(k, v)| (k, v.as_i64().unwrap()))
        .collect();
    categories.sort_by_key(|c| c.1);
    let names: Vec<&str> = categories.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "parameters",
            "gradients",
            "optimizer_state",
            "buffers",
            "activations",
            "other"
        ]
    );
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let row = docs
        .lines()
        .find(|l| l.starts_with("| gpumon_trainer_memory_bytes"))
        .expect("gpumon_trainer_memory_bytes documented");
    for n in &names {
        assert!(row.contains(&format!("`{n}`")), "{n} not in {row}");
    }

    let fit = panel("Largest safe batch");
    assert_eq!(
        exprs_of(fit),
        [
            format!("gpumon_trainer_largest_safe_batch{trainers}"),
            format!("gpumon_trainer_batch_size{trainers}"),
        ]
    );
}

/// The words `job` in `text` that are the label itself (not job_name, gpumon_job_info, $job_name).
fn job_label_uses(text: &str) -> Vec<usize> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    text.match_indices("job")
        .filter(|(i, _)| {
            let before = text[..*i].chars().next_back();
            let after = text[i + 3..].chars().next();
            !before.is_some_and(word) && !after.is_some_and(word)
        })
        .map(|(i, _)| i)
        .collect()
}

/// `job` is the scrape job: the dashboard names the trainer's job by job_name everywhere and
/// `job` only to find gpumon's targets (`up{job=~"gpumon.*"}`), or a scrape with the default
/// settings would leave panels and drop-downs matching nothing.
#[test]
fn the_dashboard_names_the_trainer_s_job_by_job_name() {
    let d = dashboard();
    let mut texts: Vec<(String, String)> = Vec::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            for k in ["expr", "legendFormat"] {
                let v = t[k].as_str().unwrap_or("").to_string();
                texts.push((format!("{title} {k}"), v));
            }
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        let v_name = v["name"].as_str().unwrap_or("?");
        texts.push((v_name.to_string(), v["definition"].to_string()));
    }
    let mut scrape_job = 0;
    for (whose, text) in &texts {
        for i in job_label_uses(text) {
            assert!(text[..i].ends_with("up{"), "{whose}: `job` in {text}");
            scrape_job += 1;
        }
    }
    assert!(scrape_job >= 1, "the target-down panel lost its scrape job");
    assert_eq!(
        job_label_uses("{{job}} by (job, x) job_name $job_name gpumon_job_info"),
        [2, 12]
    );
}

#[test]
fn metric_name_extraction_finds_names_and_skips_longer_identifiers() {
    let names = metric_names(
        "sum(rate(gpumon_ingest_lines_total{a=\"b\"}[1m])) / my_gpumon_x + gpumon_nvml_up",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["gpumon_ingest_lines_total", "gpumon_nvml_up"]
    );
}
