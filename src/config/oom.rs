//! The `[oom]` section: arming trainers (those whose client announced `oom_history`) to record
//! allocation history while an OOM is likely, and asking for what is live at the step peak.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::core::store::sessions::{OomPolicy, OOM_MAX_ENTRIES};
use crate::util::seconds::de_seconds;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OomSection {
    pub arm: bool,
    #[serde(deserialize_with = "de_seconds")]
    pub arm_eta_seconds: f64,
    #[serde(deserialize_with = "de_seconds")]
    pub arm_seconds: f64,
    pub max_entries: u64,
    pub peak_after_steps: u64,
    #[serde(deserialize_with = "de_seconds")]
    pub rearm_seconds: f64,
}

impl Default for OomSection {
    fn default() -> Self {
        let d = OomPolicy::default();
        Self {
            arm: d.arm,
            arm_eta_seconds: d.arm_eta_seconds,
            arm_seconds: d.arm_seconds,
            max_entries: d.max_entries,
            peak_after_steps: d.peak_after_steps,
            rearm_seconds: d.rearm_seconds,
        }
    }
}

impl OomSection {
    pub fn policy(&self) -> OomPolicy {
        OomPolicy {
            arm: self.arm,
            arm_eta_seconds: self.arm_eta_seconds,
            arm_seconds: self.arm_seconds,
            max_entries: self.max_entries,
            peak_after_steps: self.peak_after_steps,
            rearm_seconds: self.rearm_seconds,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                value,
                reason: reason.into(),
            })
        };
        let week = 604_800.0;
        if !(self.arm_eta_seconds >= 0.0 && self.arm_eta_seconds <= week) {
            return invalid(
                "oom.arm_eta_seconds",
                self.arm_eta_seconds.to_string(),
                "keep between 0 and 604800 seconds (a week), e.g. 3600.0",
            );
        }
        if !(self.arm_seconds >= 10.0 && self.arm_seconds <= 86_400.0) {
            return invalid(
                "oom.arm_seconds",
                self.arm_seconds.to_string(),
                "keep between 10 and 86400 seconds, e.g. 900.0: recording costs the trainer time every step",
            );
        }
        if !(1..=OOM_MAX_ENTRIES).contains(&self.max_entries) {
            return invalid(
                "oom.max_entries",
                self.max_entries.to_string(),
                "keep between 1 and 100000: torch keeps that many allocation records, each with its stack, in the trainer's memory",
            );
        }
        if self.peak_after_steps > 1_000_000 {
            return invalid(
                "oom.peak_after_steps",
                self.peak_after_steps.to_string(),
                "keep between 0 (do not ask for the peak) and 1000000 steps, e.g. 20",
            );
        }
        if !(self.rearm_seconds >= 0.0 && self.rearm_seconds <= week) {
            return invalid(
                "oom.rearm_seconds",
                self.rearm_seconds.to_string(),
                "keep between 0 and 604800 seconds (a week), e.g. 3600.0",
            );
        }
        Ok(())
    }
}
