//! The story a daemon told (its API's findings and jobs) and the one `gpumon analyze --format
//! json` tells of its recording, each as rows of named fields, and their difference, field by
//! field, as a person reads it.
//!
//! Normalised on both sides, and only this: a session is named by its trace file (with `Names`
//! of the directories and report; across a daemon restart a run's live ids are two and its
//! offline one the first; with `Names::default()` ids are compared as they are), and a
//! message is compared as two fields, its words (`message`, each session id in it read
//! `<session>`) and the traces the ids in it stand for (`message_sessions`); a finding's
//! timestamps are left out, and `after_seconds` is compared to within 2 ms (the recorder keeps
//! milliseconds).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

/// Rows by key (`job/rank/kind#n`, `job run`), each a map of field to value.
pub type Rows = BTreeMap<String, BTreeMap<&'static str, Value>>;

/// Session names to trace files: a live session id maps to the file the recorder named after it
/// (`gpumon-<started>-<session>-<job>[-r<rank>]`), an offline trace report to its own file.
#[derive(Default)]
pub struct Names {
    by_session: BTreeMap<String, String>,
    /// A trace's name to the name of the trace it resumes.
    resumes: BTreeMap<String, String>,
}

impl Names {
    /// Every trace file in `dirs`, for live session ids.
    pub fn of_dirs(dirs: &[&Path]) -> Self {
        let mut files = Vec::new();
        for d in dirs {
            for e in std::fs::read_dir(d).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                if name.ends_with(".trace.jsonl") {
                    files.push(name);
                }
            }
        }
        files.sort();
        // A trace that resumes another (a daemon restart, a reconnect) is named as the run's
        // first trace, as analyze names the run.
        let mut resumes: BTreeMap<String, String> = BTreeMap::new();
        for d in dirs {
            for f in &files {
                let Ok(text) = std::fs::read_to_string(d.join(f)) else {
                    continue;
                };
                for line in text.lines().take(8) {
                    let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
                    if v["type"] == "trace_resumes" {
                        if let Some(of) = v["file"].as_str() {
                            resumes.insert(stem(f), stem(of));
                        }
                    }
                }
            }
        }
        let mut names = Self {
            by_session: BTreeMap::new(),
            resumes,
        };
        for f in &files {
            // gpumon-<started>-s-<start>-<n>-<job>...: the session is `s-<start>-<n>`.
            let parts: Vec<&str> = f.split('-').collect();
            if parts.len() > 4 && parts[2] == "s" {
                let id = format!("s-{}-{}", parts[3], parts[4]);
                // The first part of a session is its name; `.pN` parts continue it.
                let first = names.first(f);
                names.by_session.entry(id).or_insert(first);
            }
        }
        names
    }

    /// The first trace of the run `file` is part of.
    fn first(&self, file: &str) -> String {
        let mut f = stem(file);
        while let Some(of) = self.resumes.get(&f) {
            f = of.clone();
        }
        f
    }

    /// Offline: a report's traces, by whatever session name they carry.
    pub fn add_report(&mut self, report: &Value) {
        for t in report["traces"].as_array().into_iter().flatten() {
            let file = t["file"].as_str().map(base).unwrap_or_default();
            if let Some(s) = t["session"].as_str() {
                let first = self.first(&file);
                self.by_session.insert(s.to_string(), first);
            }
        }
    }

    /// The trace a session name stands for: a live or offline id, or a file path.
    pub fn name(&self, s: &str) -> String {
        if let Some(f) = self.by_session.get(s) {
            return f.clone();
        }
        if s.contains('/') || s.ends_with(".jsonl") {
            return self.first(&base(s));
        }
        s.to_string()
    }

    /// `text` with every session id it names (`s-<start>-<n>` as a daemon names it, `s-<n>`)
    /// replaced by `<session>`, and the names of the traces those ids stand for (an id no trace
    /// is known by stays as it is), in order.
    pub fn text(&self, text: &str) -> (String, Vec<String>) {
        let mut out = String::new();
        let mut named = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find("s-") {
            let (before, from) = rest.split_at(i);
            out.push_str(before);
            let boundary = !before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '-');
            match session_id(from).filter(|_| boundary) {
                Some(n) => {
                    let id = &from[..n];
                    named.push(
                        self.by_session
                            .get(id)
                            .cloned()
                            .unwrap_or_else(|| id.to_string()),
                    );
                    out.push_str("<session>");
                    rest = &from[n..];
                }
                None => {
                    out.push_str("s-");
                    rest = &from[2..];
                }
            }
        }
        out.push_str(rest);
        (out, named)
    }
}

/// The length of the session id `from` starts with: `s-`, an alphanumeric start, `-`, digits
/// (a daemon's), or `s-` and digits.
fn session_id(from: &str) -> Option<usize> {
    let word = from[2..]
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(from.len() - 2);
    if word == 0 {
        return None;
    }
    let after = &from[2 + word..];
    let digits = after
        .strip_prefix('-')
        .map(|d| d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()))
        .unwrap_or(0);
    if digits > 0 {
        Some(3 + word + digits)
    } else if from[2..2 + word].chars().all(|c| c.is_ascii_digit()) {
        Some(2 + word)
    } else {
        None
    }
}

fn base(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// A trace's name without its directory, part number or suffix.
fn stem(file: &str) -> String {
    let f = file.trim_end_matches(".trace.jsonl");
    match f.rsplit_once(".p") {
        Some((s, n)) if n.chars().all(|c| c.is_ascii_digit()) => s.to_string(),
        _ => f.to_string(),
    }
}

fn opt_str(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

fn consequence(v: &Value, names: &Names) -> Value {
    if v.is_null() {
        return Value::Null;
    }
    json!({
        "session": v["session"].as_str().map(|s| names.name(s)),
        "rank": v["rank"],
        "kind": v["kind"],
        "host": v["host"],
    })
}

fn text(v: &Value, names: &Names) -> Value {
    match v.as_str() {
        Some(s) => Value::String(names.text(s).0),
        None => v.clone(),
    }
}

/// The traces the sessions a text names stand for.
fn sessions_named(v: &Value, names: &Names) -> Value {
    match v.as_str() {
        Some(s) => json!(names.text(s).1),
        None => Value::Null,
    }
}

/// Rows of findings keyed `job/rank/kind#n` (n counts a kind raised again on one rank, oldest
/// first), from (job, rank, finding) triples.
fn finding_rows<'a>(found: impl Iterator<Item = (Value, Value, &'a Value)>, names: &Names) -> Rows {
    let mut list: Vec<(String, f64, &Value)> = found
        .map(|(job, rank, f)| {
            let key = format!(
                "{}/r{}/{}",
                opt_str(&job),
                opt_str(&rank),
                opt_str(&f["kind"])
            );
            (key, f["first_ts"].as_f64().unwrap_or(0.0), f)
        })
        .collect();
    list.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut rows = Rows::new();
    let mut n: BTreeMap<String, u32> = BTreeMap::new();
    for (key, _, f) in list {
        let k = n.entry(key.clone()).or_default();
        *k += 1;
        let mut row = BTreeMap::new();
        row.insert("severity", f["severity"].clone());
        row.insert("state", f["state"].clone());
        row.insert("consequence_of", consequence(&f["consequence_of"], names));
        row.insert("message", text(&f["message"], names));
        row.insert("message_sessions", sessions_named(&f["message"], names));
        row.insert("hint", text(&f["hint"], names));
        row.insert("gpu_uuid", f["gpu_uuid"].clone());
        rows.insert(format!("{key}#{k}"), row);
    }
    rows
}

/// The findings a daemon's API gave (its snapshot's `findings`: firing, held and resolved).
pub fn live_findings(snapshots: &[&Value], names: &Names) -> Rows {
    finding_rows(
        snapshots.iter().flat_map(|s| {
            s["findings"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| (f["job"].clone(), f["rank"].clone(), f))
        }),
        names,
    )
}

/// The findings of an analyze report, each under its trace's job and rank.
pub fn offline_findings(report: &Value, names: &Names) -> Rows {
    finding_rows(
        report["traces"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|t| {
                t["findings"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(move |f| (t["job"].clone(), t["rank"].clone(), f))
            }),
        names,
    )
}

fn failure(v: &Value, names: &Names) -> Value {
    if v.is_null() {
        return Value::Null;
    }
    json!({
        "rank": v["rank"],
        "kind": v["kind"],
        "session": v["session"].as_str().map(|s| names.name(s)),
        "host": v["host"],
        "step": v["step"],
        "message": text(&v["message"], names),
        "exception": v["exception"],
        "signal": v["signal"],
        "after_seconds": v["after_seconds"],
        "order_unknown": v["order_unknown"],
    })
}

fn failures(v: &Value, names: &Names) -> Value {
    Value::Array(
        v.as_array()
            .into_iter()
            .flatten()
            .map(|f| failure(f, names))
            .collect(),
    )
}

fn job_findings(v: &Value, names: &Names) -> Value {
    Value::Array(
        v.as_array()
            .into_iter()
            .flatten()
            .map(|f| json!({"kind": f["kind"], "ranks": f["ranks"], "message": text(&f["message"], names)}))
            .collect(),
    )
}

/// Jobs keyed `job run` (run `-` when none), each with its verdict's fields.
pub fn jobs(list: &Value, names: &Names) -> Rows {
    let mut rows = Rows::new();
    for j in list.as_array().into_iter().flatten() {
        let key = format!("{} {}", opt_str(&j["job"]), opt_str(&j["run_id"]));
        let mut row = BTreeMap::new();
        row.insert("state", j["state"].clone());
        row.insert("uid", j["uid"].clone());
        row.insert("world_size", j["world_size"].clone());
        row.insert("ranks", j["ranks"].clone());
        row.insert("hosts", j["hosts"].clone());
        row.insert("first_failure", failure(&j["first_failure"], names));
        row.insert("stop", failure(&j["stop"], names));
        row.insert("consequences", failures(&j["consequences"], names));
        row.insert("other_failures", failures(&j["other_failures"], names));
        row.insert(
            "findings_at_failure",
            job_findings(&j["findings_at_failure"], names),
        );
        row.insert("restarts", j["restarts"].clone());
        row.insert("previous_failure", failure(&j["previous_failure"], names));
        row.insert("conflicts", j["conflicts"].clone());
        let mut key = key;
        // Two users' runs of one name are two jobs.
        if rows.contains_key(&key) {
            key = format!("{key} uid {}", opt_str(&j["uid"]));
        }
        rows.insert(key, row);
    }
    rows
}

/// Equal, but for `after_seconds` within 2 ms and absent arrays read as empty.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Array(v)) | (Value::Array(v), Value::Null) => v.is_empty(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().all(|k| {
                let (p, q) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if k == "after_seconds" {
                    match (p.as_f64(), q.as_f64()) {
                        (Some(p), Some(q)) => (p - q).abs() <= 0.002,
                        _ => p == q,
                    }
                } else {
                    same(p, q)
                }
            })
        }
        _ => a == b,
    }
}

/// One difference: a row only one side has, or a field the two sides give differently.
#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    pub key: String,
    /// None: the whole row.
    pub field: Option<&'static str>,
    pub live: Value,
    pub offline: Value,
}

impl std::fmt::Display for Diff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Value| match v {
            Value::Null => "(absent)".to_string(),
            v => serde_json::to_string_pretty(v).unwrap_or_default(),
        };
        match self.field {
            None => write!(
                f,
                "{}: live {} / offline {}",
                self.key,
                if self.live.is_null() {
                    "has none"
                } else {
                    "has it"
                },
                if self.offline.is_null() {
                    "has none"
                } else {
                    "has it"
                },
            ),
            Some(field) => write!(
                f,
                "{} .{field}:\n    live:    {}\n    offline: {}",
                self.key,
                show(&self.live).replace('\n', "\n             "),
                show(&self.offline).replace('\n', "\n             "),
            ),
        }
    }
}

pub fn diff(live: &Rows, offline: &Rows) -> Vec<Diff> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = live.keys().chain(offline.keys()).collect();
    for key in keys {
        match (live.get(key), offline.get(key)) {
            (Some(l), Some(o)) => {
                let fields: std::collections::BTreeSet<&&str> = l.keys().chain(o.keys()).collect();
                for field in fields {
                    let (a, b) = (
                        l.get(*field).unwrap_or(&Value::Null),
                        o.get(*field).unwrap_or(&Value::Null),
                    );
                    if !same(a, b) {
                        out.push(Diff {
                            key: key.clone(),
                            field: Some(field),
                            live: a.clone(),
                            offline: b.clone(),
                        });
                    }
                }
            }
            (l, o) => out.push(Diff {
                key: key.clone(),
                field: None,
                live: l.map_or(Value::Null, |_| Value::Bool(true)),
                offline: o.map_or(Value::Null, |_| Value::Bool(true)),
            }),
        }
    }
    out
}

pub fn render(what: &str, diffs: &[Diff]) -> String {
    let mut s = format!(
        "{what}: {} difference(s) between live and offline\n",
        diffs.len()
    );
    for d in diffs {
        s.push_str(&format!("  {d}\n"));
    }
    s
}
