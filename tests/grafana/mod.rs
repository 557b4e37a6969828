//! The shipped Grafana dashboard's queries, as Grafana would send them to Prometheus with "All"
//! selected in every drop-down (dashboards/README.md, "Running the queries outside Grafana").
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use serde_json::Value;

pub const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/dashboards/gpumon-gpu-memory.json"
);

/// One panel query.
pub struct Query {
    pub title: String,
    pub ref_id: String,
    /// As written in the dashboard.
    pub expr: String,
    /// As Grafana runs it.
    pub promql: String,
    pub legend: String,
}

pub struct Dashboard {
    pub queries: Vec<Query>,
    /// (name, `label_values(selector, label)` definition) of each query variable.
    pub variables: Vec<(String, String)>,
    names: BTreeSet<String>,
}

impl Dashboard {
    pub fn load() -> Dashboard {
        let d: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
        let list = d["templating"]["list"].as_array().unwrap();
        let names: BTreeSet<String> = list
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect();
        let variables = list
            .iter()
            .filter_map(|v| {
                Some((
                    v["name"].as_str()?.to_string(),
                    v["definition"].as_str()?.to_string(),
                ))
            })
            .collect();
        let mut panels = Vec::new();
        for p in d["panels"].as_array().unwrap() {
            panels.push(p);
            panels.extend(p["panels"].as_array().into_iter().flatten());
        }
        let queries = panels
            .iter()
            .flat_map(|p| {
                p["targets"].as_array().into_iter().flatten().map(|t| {
                    let expr = t["expr"].as_str().unwrap_or("").to_string();
                    Query {
                        title: p["title"].as_str().unwrap_or("?").to_string(),
                        ref_id: t["refId"].as_str().unwrap_or("?").to_string(),
                        promql: substituted(&expr, &names),
                        expr,
                        legend: t["legendFormat"].as_str().unwrap_or("").to_string(),
                    }
                })
            })
            .collect();
        Dashboard {
            queries,
            variables,
            names,
        }
    }

    /// The query of panel `title` with `ref_id`.
    pub fn query(&self, title: &str, ref_id: &str) -> &Query {
        self.queries
            .iter()
            .find(|q| q.title == title && q.ref_id == ref_id)
            .unwrap_or_else(|| panic!("the dashboard has no panel {title:?} with query {ref_id}"))
    }

    /// A text with the dashboard's variables replaced as in its queries.
    pub fn substituted(&self, text: &str) -> String {
        substituted(text, &self.names)
    }
}

/// `expr` with the dashboard's own variables (`names`) matching anything, Grafana's interval
/// variables 1m (at least four scrape intervals, as dashboards/README.md asks).
pub fn substituted(expr: &str, names: &BTreeSet<String>) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(inner) => {
                let end = inner.find('}').unwrap();
                // ${var:format}: the format does not matter for `.*`.
                (inner[..end].split(':').next().unwrap(), end + 2)
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        let value = match name {
            "__rate_interval" | "__interval" | "__range" => "1m",
            _ if names.contains(name) => ".*",
            // label_replace's capture group: Grafana leaves a name it does not define as it is.
            _ if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) => {
                &rest[i..i + 1 + len]
            }
            _ => panic!("{expr} uses ${name}, which neither the dashboard nor Grafana defines"),
        };
        out.push_str(value);
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// The vector selectors (`name{matchers}`) in a PromQL expression.
pub fn selectors(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = expr[from..].find('{').map(|i| i + from) {
        let start = expr[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |j| j + 1);
        let end = expr[i..].find('}').map_or(expr.len(), |j| i + j + 1);
        if start < i {
            out.push(expr[start..end].to_string());
        }
        from = end;
    }
    out
}

/// The `{{label}}` names in a legend format.
pub fn legend_labels(legend: &str) -> Vec<&str> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|s| s.split_once("}}").map(|(l, _)| l.trim()))
        .collect()
}

#[test]
fn selectors_and_legend_labels_are_found() {
    let names = BTreeSet::from(["gpu".to_string()]);
    let e = substituted(
        "count(a_b{gpu=~\"$gpu\"} == 0) or on(x) rate(c:d{y=\"1\"}[$__rate_interval]) or vector(0)",
        &names,
    );
    assert_eq!(
        e,
        "count(a_b{gpu=~\".*\"} == 0) or on(x) rate(c:d{y=\"1\"}[1m]) or vector(0)"
    );
    assert_eq!(selectors(&e), ["a_b{gpu=~\".*\"}", "c:d{y=\"1\"}"]);
    assert_eq!(
        substituted(
            r#"label_replace(x, "r", "rank $1", "rank", "(.+)")"#,
            &names
        ),
        r#"label_replace(x, "r", "rank $1", "rank", "(.+)")"#
    );
    assert_eq!(
        legend_labels("{{job}} rank {{ rank }} ({{instance}})"),
        ["job", "rank", "instance"]
    );
}
