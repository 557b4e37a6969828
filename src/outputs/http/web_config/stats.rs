//! How reloads of the web config went, as Prometheus reports its own config reloads
//! (`prometheus_config_last_reload_successful` and its kin), so one alert rule fits both.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::util::family::{Family, Kind};
use crate::util::health::Health;

#[derive(Debug)]
pub struct ReloadStats {
    successful: AtomicBool,
    /// Seconds since the epoch, as f64 bits.
    success_at: AtomicU64,
    failures: AtomicU64,
}

impl ReloadStats {
    /// After the load at start, which succeeded (a failure there stops the daemon).
    pub(super) fn loaded_now() -> Self {
        Self {
            successful: AtomicBool::new(true),
            success_at: AtomicU64::new(now().to_bits()),
            failures: AtomicU64::new(0),
        }
    }

    pub(super) fn succeeded(&self) {
        self.success_at.store(now().to_bits(), Ordering::Relaxed);
        self.successful.store(true, Ordering::Relaxed);
    }

    pub(super) fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.successful.store(false, Ordering::Relaxed);
    }

    pub fn last_successful(&self) -> bool {
        self.successful.load(Ordering::Relaxed)
    }

    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

impl Health for ReloadStats {
    fn families(&self, out: &mut String) {
        let mut ok = Family::gauge(
            "gpumon_web_config_last_reload_successful",
            "Whether the last reload of the web config (--web.config.file) was applied (1) or refused (0); the config in force stays on a refusal.",
            &[],
        );
        ok.add(&[], if self.last_successful() { 1.0 } else { 0.0 });
        ok.finish(out);
        let mut at = Family::gauge(
            "gpumon_web_config_last_reload_success_timestamp_seconds",
            "When the web config in force was loaded (at start, or its last applied reload), in seconds since the epoch.",
            &[],
        );
        at.add(&[], f64::from_bits(self.success_at.load(Ordering::Relaxed)));
        at.finish(out);
        let mut failures = Family::new(
            "gpumon_web_config_reload_failures_total",
            "Reloads of the web config refused: unreadable, empty, unparsable, still being written, certificates that do not load, or turning TLS or authentication off.",
            Kind::Counter,
            &[],
        );
        failures.add(&[], self.failures() as f64);
        failures.finish(out);
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
