//! The TUI's view of a detection finding. Detection is younger than the snapshot format, so
//! this reads whatever the daemon sends leniently: every field is optional, numbers may come as
//! strings and the GPU index as either, and an entry that is not an object is skipped.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::detect::attribution::Attribution;
use crate::model::Timestamp;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Finding {
    pub id: String,
    /// leak, near_limit, fragmentation, oom, crash (others are shown as they come).
    pub kind: String,
    /// pending, firing, resolved.
    pub state: String,
    /// warning, critical.
    pub severity: String,
    #[serde(deserialize_with = "text")]
    pub session: Option<String>,
    #[serde(deserialize_with = "text")]
    pub job: Option<String>,
    #[serde(deserialize_with = "int")]
    pub rank: Option<u64>,
    #[serde(deserialize_with = "int")]
    pub pid: Option<u64>,
    #[serde(deserialize_with = "int")]
    pub ns_pid: Option<u64>,
    #[serde(deserialize_with = "text")]
    pub gpu_uuid: Option<String>,
    /// NVML index, as text ("0").
    #[serde(deserialize_with = "text")]
    pub gpu: Option<String>,
    #[serde(deserialize_with = "int")]
    pub first_step: Option<u64>,
    #[serde(deserialize_with = "num")]
    pub first_ts: Option<Timestamp>,
    /// When it started firing.
    #[serde(deserialize_with = "num")]
    pub since: Option<Timestamp>,
    #[serde(deserialize_with = "num")]
    pub updated_ts: Option<Timestamp>,
    #[serde(deserialize_with = "num")]
    pub resolved_ts: Option<Timestamp>,
    #[serde(deserialize_with = "text_or_empty")]
    pub message: String,
    #[serde(deserialize_with = "text")]
    pub hint: Option<String>,
    #[serde(deserialize_with = "evidence")]
    pub evidence: Evidence,
    /// Leak findings: where the growing memory was allocated, as the trainer measured it. One
    /// that does not parse is left out, not the finding.
    #[serde(deserialize_with = "attribution")]
    pub attribution: Option<Attribution>,
}

/// Kind-specific numbers; each is there only when the detector that raised the finding has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Evidence {
    #[serde(deserialize_with = "num")]
    pub slope_bytes_per_step: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub slope_bytes_per_second: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub growth_bytes: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub confidence: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub oom_eta_steps: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub oom_eta_seconds: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub retries: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub headroom_bytes: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub ratio: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub fragmented_bytes: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub alloc_bytes: Option<f64>,
    #[serde(deserialize_with = "num")]
    pub device_free: Option<f64>,
}

/// Lifecycle position, in the order the Findings screen lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    Firing,
    Pending,
    Resolved,
    Other,
}

impl Finding {
    pub fn state(&self) -> State {
        match self.state.as_str() {
            "firing" => State::Firing,
            "pending" => State::Pending,
            "resolved" => State::Resolved,
            _ => State::Other,
        }
    }

    pub fn firing(&self) -> bool {
        self.state() == State::Firing
    }

    pub fn critical(&self) -> bool {
        self.severity == "critical"
    }

    /// The time the Findings screen sorts by: when it resolved, else when it started firing.
    pub fn sort_ts(&self) -> Timestamp {
        self.resolved_ts
            .or(self.since)
            .or(self.updated_ts)
            .or(self.first_ts)
            .unwrap_or(0.0)
    }

    /// A short label for badges: "leak", "near", "frag", "oom", "crash".
    pub fn badge(&self) -> &str {
        match self.kind.as_str() {
            "near_limit" => "near",
            "fragmentation" => "frag",
            other => other,
        }
    }
}

/// Reads the snapshot's findings, whatever type the snapshot holds them as.
pub fn parse_all<T: Serialize>(raw: &[T]) -> Vec<Finding> {
    raw.iter()
        .filter_map(|f| serde_json::to_value(f).ok())
        .filter(Value::is_object)
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect()
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    })
}

fn evidence<'de, D: Deserializer<'de>>(d: D) -> Result<Evidence, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(serde_json::from_value(v).unwrap_or_default())
}

fn attribution<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Attribution>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

fn text_or_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(text(d)?.unwrap_or_default())
}

fn num<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|x| x.is_finite()))
}

fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|x| *x >= 0.0).map(|x| x as u64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_documented_shape() {
        let raw = vec![json!({
            "id":"s-3/leak","kind":"leak","state":"firing","severity":"critical",
            "session":"s-3","job":"llama-ft","rank":0,"pid":4242,"ns_pid":17,
            "gpu_uuid":"GPU-1","gpu":"0","first_step":812,"first_ts":1763700406.0,
            "since":1763700406.0,"updated_ts":1763700500.0,"resolved_ts":null,
            "message":"allocated floor grows","hint":"store loss.item()",
            "evidence":{"slope_bytes_per_step":2097152.0,"oom_eta_steps":30500,"confidence":0.999},
            "attribution":{"id":1,"ts":1763700300.0,"step_from":60,"step_to":180,
                "total_growth_bytes":125829120,"sites":[{"file":"/home/alice/proj/train.py",
                "line":27,"function":"kept_outputs","bytes":125829120,"blocks":120,
                "stack":[{"file":"/home/alice/proj/train.py","line":48,"function":"run"}]}]}
        })];
        let f = &parse_all(&raw)[0];
        assert_eq!(f.kind, "leak");
        assert!(f.firing() && f.critical());
        assert_eq!(f.gpu.as_deref(), Some("0"));
        assert_eq!((f.pid, f.ns_pid, f.rank), (Some(4242), Some(17), Some(0)));
        assert_eq!(f.evidence.slope_bytes_per_step, Some(2097152.0));
        assert_eq!(f.evidence.oom_eta_steps, Some(30500.0));
        assert_eq!(f.resolved_ts, None);
        assert_eq!(f.sort_ts(), 1763700406.0);
        let a = f.attribution.as_ref().unwrap();
        assert_eq!((a.step_from, a.step_to), (Some(60), Some(180)));
        assert_eq!(a.sites[0].short(), "train.py:27");
        assert_eq!(a.sites[0].stack[0].function, "run");
    }

    #[test]
    fn tolerates_other_types_missing_fields_and_junk() {
        let raw = vec![
            json!({"kind":"near_limit","gpu":1,"rank":"2","evidence":{"retries":"7"},"extra":[1]}),
            json!("not an object"),
            json!({"kind":"crash","evidence":null,"message":null,"pid":-5,
                "attribution":{"sites":"not a list"}}),
        ];
        let all = parse_all(&raw);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].gpu.as_deref(), Some("1"));
        assert_eq!(all[0].rank, Some(2));
        assert_eq!(all[0].evidence.retries, Some(7.0));
        assert_eq!(all[0].badge(), "near");
        assert_eq!(all[0].state(), State::Other);
        assert_eq!(all[1].pid, None);
        assert_eq!(all[1].message, "");
        // A malformed attribution is dropped, the finding kept.
        assert_eq!(
            (all[1].kind.as_str(), &all[1].attribution),
            ("crash", &None)
        );
    }
}
