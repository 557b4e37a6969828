//! Alertmanager's v2 API: `POST /api/v2/alerts` with labels (alertname, severity, gpu, uuid, pid,
//! job, rank, ...), annotations and startsAt/endsAt. A firing alert's endsAt lies a few resend
//! intervals ahead, so Alertmanager resolves it by itself if this daemon dies.
//!
//! A leak the trainer attributed also carries `attribution` (the top site, its share and the
//! window, or why the trainer could not say) and `attribution_stack` (that site's stack, one
//! frame a line). Annotations are not labels: they change without making a new alert.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::{rfc3339, AlertSettings, Sink};
use crate::core::detect::{Finding, FindingState, Kind};
use crate::outputs::attribution_text;

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
    json!({
        "labels": {
            "alertname": alertname(f.kind),
            "severity": serde_json::to_value(f.severity).unwrap_or(Value::Null),
            "kind": f.kind.as_str(),
            "instance": hostname,
            "gpu": opt(f.gpu.clone()),
            "uuid": opt(s.gpu_uuid.clone()),
            "pid": s.pid.to_string(),
            "job": opt(s.job.clone()),
            "rank": opt(s.rank.map(|r| r.to_string())),
            "session": s.session,
            "finding": f.id,
        },
        "annotations": annotations,
        "startsAt": rfc3339(f.since.unwrap_or(f.first_ts)),
        "endsAt": rfc3339(ends),
        "generatorURL": api_url,
    })
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
            .map(|f| alert(f, &self.hostname, &self.api_url, self.ends_after))
            .collect();
        self.agent
            .post(&self.url)
            .send_json(&body)
            .map(|_| ())
            .map_err(|e| format!("POST {}: {e}", self.url))
    }
}
