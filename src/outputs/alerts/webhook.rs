//! A generic JSON webhook: `POST {"host": ..., "findings": [...]}` with each finding as the API
//! shows it (a leak's `attribution` included, every site with its stack), for chat bots and
//! ticket systems that speak plain JSON.

use std::time::Duration;

use serde_json::{json, Value};

use super::{AlertSettings, Sink};
use crate::core::detect::Finding;

pub struct Webhook {
    url: String,
    agent: ureq::Agent,
    hostname: String,
}

impl Webhook {
    pub fn new(url: &str, s: &AlertSettings) -> Self {
        Self {
            url: url.to_string(),
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(5)))
                .build()
                .new_agent(),
            hostname: s.hostname.clone(),
        }
    }
}

/// What one POST carries.
pub fn body(hostname: &str, batch: &[Finding]) -> Value {
    json!({"version": 1, "host": hostname, "findings": batch})
}

impl Sink for Webhook {
    fn name(&self) -> &'static str {
        "webhook"
    }

    fn wants_resend(&self) -> bool {
        false
    }

    fn send(&self, batch: &[Finding]) -> Result<(), String> {
        self.agent
            .post(&self.url)
            .send_json(body(&self.hostname, batch))
            .map(|_| ())
            .map_err(|e| format!("POST {}: {e}", self.url))
    }
}
