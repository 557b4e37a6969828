//! Alertmanager's v2 API: `POST /api/v2/alerts` with labels (alertname, severity, gpu, uuid, pid,
//! job_name, rank, ...), annotations and startsAt/endsAt. A firing alert's endsAt lies a few resend
//! intervals ahead, so Alertmanager resolves it by itself if this daemon dies.
//!
//! A leak the trainer attributed also carries `attribution` (the top site, its share and the
//! window, or why the trainer could not say) and `attribution_stack` (that site's stack, one
//! frame a line). Annotations are not labels: they change without making a new alert. A
//! near_limit finding an armed trainer reported the step peak for carries `peak_top_site` (the
//! largest site live at the peak, its share of the peak and the steps, or why the trainer could
//! not say).
//!
//! An explained OOM carries `oom_pattern`, `oom_failing_site` (`file:line in function`),
//! `oom_top_live_site` (the largest live site, its bytes and share of live memory) and
//! `oom_survived`. An OOM the trainer went on from is a warning; `severity` is a label, so the
//! same POST ends the critical alert the OOM first raised, and nothing is left to page.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{rfc3339, AlertSettings, Sink};
use crate::core::detect::findings::{consequence_text, Severity, Transition};
use crate::core::detect::{Finding, FindingState, Kind};
use crate::outputs::{attribution_text, explanation_text, peak_text};
use crate::util::printable::{printable, printable_json, printable_lines};

/// Frames of the top site's stack in the `attribution_stack` annotation, at most.
const STACK_FRAMES: usize = 8;

pub struct Alertmanager {
    url: String,
    agent: ureq::Agent,
    hostname: String,
    api_url: String,
    ends_after: f64,
}

impl Alertmanager {
    pub fn new(base: &str, s: &AlertSettings) -> Self {
        Self {
            url: format!("{}/api/v2/alerts", base.trim_end_matches('/')),
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(5)))
                .build()
                .new_agent(),
            hostname: s.hostname.clone(),
            api_url: s.api_url.clone(),
            ends_after: 4.0 * s.resend_interval.as_secs_f64().max(60.0),
        }
    }
}

pub fn alertname(kind: Kind) -> &'static str {
    match kind {
        Kind::Leak => "GpumonLeak",
        Kind::NearLimit => "GpumonNearLimit",
        Kind::Fragmentation => "GpumonFragmentation",
        Kind::Oom => "GpumonOOM",
        Kind::Crash => "GpumonTrainerCrash",
        Kind::Stopped => "GpumonTrainerStopped",
        Kind::UntrackedGrowth => "GpumonUntrackedGrowth",
        Kind::OrphanedMemory => "GpumonOrphanedMemory",
        Kind::CacheGrowth => "GpumonCacheGrowth",
        // Only a newer daemon's finding read back could be Unknown; this daemon raises none.
        Kind::Unknown => "GpumonFinding",
    }
}

pub fn alert(f: &Finding, hostname: &str, api_url: &str, ends_after: f64) -> Value {
    let s = &f.subject;
    let opt = |v: Option<String>| v.unwrap_or_default();
    let ends = match (f.state, f.resolved_ts) {
        (FindingState::Resolved, Some(t)) => t,
        _ => crate::core::model::now() + ends_after,
    };
    let mut annotations = Map::new();
    annotations.insert("summary".into(), f.message.clone().into());
    annotations.insert("description".into(), opt(f.hint.clone()).into());
    if let Some(a) = &f.attribution {
        annotations.insert("attribution".into(), attribution_text::summary(a).into());
        if let Some(top) = a.top().filter(|_| a.error.is_none()) {
            let stack = attribution_text::stack(top, STACK_FRAMES).join("\n");
            annotations.insert("attribution_stack".into(), stack.into());
        }
    }
    if let Some(p) = &f.peak {
        annotations.insert("peak_top_site".into(), peak_text::summary(p).into());
    }
    if let Some(c) = &f.consequence_of {
        // What this failure followed: the job's first failure (jobs.md), which pages instead.
        annotations.insert("consequence_of".into(), consequence_text(c).into());
    }
    if f.kind == Kind::Oom {
        oom_annotations(f, &mut annotations);
    }
    // Read by people (Alertmanager's UI, mail, chat): a trainer's strings go there escaped. The
    // stack keeps its line breaks; the webhook's JSON keeps the true values.
    for (k, v) in annotations.iter_mut() {
        if let Value::String(s) = v {
            let safe = if k == "attribution_stack" {
                printable_lines(s)
            } else {
                printable(s)
            };
            if let std::borrow::Cow::Owned(o) = safe {
                *s = o;
            }
        }
    }
    let mut alert = json!({
        "labels": {
            "alertname": alertname(f.kind),
            "severity": serde_json::to_value(f.severity).unwrap_or(Value::Null),
            "kind": f.kind.as_str(),
            "instance": hostname,
            "gpu": opt(f.gpu.map(|g| g.to_string())),
            "uuid": opt(s.gpu_uuid.clone()),
            "pid": s.pid.to_string(),
            // The trainer's job name as the Prometheus rules' alerts carry it: `job` is their
            // scrape job, and the shipped inhibit matches on (job_name, run_id, uid).
            "job_name": opt(s.job.clone()),
            "run_id": opt(s.run_id.clone()),
            "uid": opt(s.uid.map(|u| u.to_string())),
            "rank": opt(s.rank.map(|r| r.to_string())),
            "session": s.session,
            "finding": f.id,
        },
        "annotations": annotations,
        "startsAt": rfc3339(f.since.unwrap_or(f.first_ts)),
        "endsAt": rfc3339(ends),
        "generatorURL": api_url,
    });
    if let Some(labels) = alert.get_mut("labels") {
        printable_json(labels);
    }
    alert
}

fn oom_annotations(f: &Finding, annotations: &mut Map<String, Value>) {
    let e = &f.evidence;
    let survived = if e.survived == Some(true) {
        "true"
    } else {
        "false"
    };
    annotations.insert("oom_survived".into(), survived.into());
    let Some(x) = e.explanation.as_deref() else {
        return;
    };
    annotations.insert("oom_pattern".into(), x.pattern.as_str().into());
    let failing = explanation_text::failing(x)
        .or_else(|| explanation_text::lines_unknown(x).map(String::from));
    if let Some(site) = failing {
        annotations.insert("oom_failing_site".into(), site.into());
    }
    if let Some(top) = explanation_text::top_live(x) {
        annotations.insert("oom_top_live_site".into(), top.into());
    }
}

/// The alerts one finding posts: itself, and for an OOM the trainer went on from, the critical
/// alert it raised first, ended now (a resolved alert Alertmanager never saw is a no-op).
pub fn alerts(f: &Finding, hostname: &str, api_url: &str, ends_after: f64) -> Vec<Value> {
    let mut out = vec![alert(f, hostname, api_url, ends_after)];
    if f.kind == Kind::Oom && f.evidence.survived == Some(true) && f.severity != Severity::Critical
    {
        let mut was = f.clone();
        was.severity = Severity::Critical;
        was.transition(Transition::Resolve {
            at: f.updated_ts,
            why: None,
        });
        out.push(alert(&was, hostname, api_url, ends_after));
    }
    out
}

impl Sink for Alertmanager {
    fn name(&self) -> &'static str {
        "alertmanager"
    }

    fn wants_resend(&self) -> bool {
        true
    }

    fn send(&self, batch: &[Finding]) -> Result<(), String> {
        let body: Vec<Value> = batch
            .iter()
            .flat_map(|f| alerts(f, &self.hostname, &self.api_url, self.ends_after))
            .collect();
        self.agent
            .post(&self.url)
            .send_json(&body)
            .map(|_| ())
            .map_err(|e| format!("POST {}: {e}", self.url))
    }
}
