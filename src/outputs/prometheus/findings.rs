//! Detection series: per-session leak, OOM forecast and near-limit gauges, and findings by kind.

use super::trainers::{Labelled, OMITTED, T};
use crate::core::detect::{FindingState, Kind};
use crate::core::store::Store;
use crate::util::family::{self, Family};

pub fn finding_families(store: &Store, sessions: &Labelled, out: &mut String) {
    let g = |name: &'static str, help: &'static str| {
        Family::gauge(name, help, T).omitting_empty(OMITTED)
    };
    let mut leak = g(
        "gpumon_leak_suspected",
        "1 while a leak finding is firing for this trainer.",
    );
    let mut slope = g(
        "gpumon_leak_growth_bytes_per_step",
        "Robust (Theil-Sen) slope of the per-step allocated floor while a leak is pending or firing; 0 otherwise.",
    );
    let mut eta = g(
        "gpumon_oom_eta_seconds",
        "Forecast seconds until the trainer's step peak reaches the device limit at the rate of its leak or of its growth outside the allocator, whichever is sooner.",
    );
    let mut near = g(
        "gpumon_near_limit",
        "1 while allocator retries are rising or headroom is under the margin.",
    );
    let mut untracked = g(
        "gpumon_untracked_growth",
        "1 while an untracked_growth finding is firing: the trainer's memory outside PyTorch's allocator keeps growing.",
    );
    let mut cache = g(
        "gpumon_cache_growth",
        "1 while a cache_growth finding is firing: the trainer's reserved memory (PyTorch's cache) keeps growing while allocated stays flat.",
    );
    let mut cache_eta = g(
        "gpumon_cache_full_eta_seconds",
        "Forecast seconds until the trainer's reserved memory reaches the device limit (or the allocator's cap) at the rate of its cache_growth finding; absent without one.",
    );
    let mut firing = Family::gauge(
        "gpumon_findings_firing",
        "Findings firing now, by kind.",
        &["kind"],
    );
    let mut counts = [0u64; Kind::SLOTS];
    for (own, s, shown) in sessions {
        for f in s.detect.current() {
            if f.state == FindingState::Firing {
                counts[f.kind.index()] += 1;
            }
        }
        if !shown {
            continue;
        }
        let l = own.as_array(s);
        let leak_finding = s.detect.current().find(|f| f.kind == Kind::Leak);
        let leak_firing = leak_finding.is_some_and(|f| f.state == FindingState::Firing);
        leak.add(&l, if leak_firing { 1.0 } else { 0.0 });
        slope.add(
            &l,
            leak_finding
                .and_then(|f| f.evidence.slope_bytes_per_step)
                .unwrap_or(0.0),
        );
        let outside = s.detect.firing(Kind::UntrackedGrowth);
        untracked.add(&l, if outside.is_some() { 1.0 } else { 0.0 });
        let soonest = leak_finding
            .filter(|_| leak_firing)
            .into_iter()
            .chain(outside)
            .filter_map(|f| f.evidence.oom_eta_seconds)
            .min_by(f64::total_cmp);
        if let Some(secs) = soonest {
            eta.add(&l, secs);
        }
        let growing = s.detect.firing(Kind::CacheGrowth);
        cache.add(&l, if growing.is_some() { 1.0 } else { 0.0 });
        if let Some(secs) = growing.and_then(|f| f.evidence.oom_eta_seconds) {
            cache_eta.add(&l, secs);
        }
        let near_firing = s.detect.firing(Kind::NearLimit).is_some();
        near.add(&l, if near_firing { 1.0 } else { 0.0 });
    }
    for f in store.sessions.findings.held() {
        counts[f.kind.index()] += 1;
    }
    for f in store.orphans.current() {
        counts[f.kind.index()] += 1;
    }
    for k in Kind::ALL {
        firing.add(&[k.as_str()], counts[k.index()] as f64);
    }
    let mut total = Family::new(
        "gpumon_findings_total",
        "Findings raised (fired) since the daemon started, by kind.",
        family::Kind::Counter,
        &["kind"],
    );
    for (k, n) in store.sessions.findings.totals() {
        total.add(&[k.as_str()], n as f64);
    }
    let mut suppressed = Family::new(
        "gpumon_log_suppressed_total",
        "Finding and trainer session log lines left out since the daemon started: past a burst per interval, one summary line says how many.",
        family::Kind::Counter,
        &[],
    );
    suppressed.add(
        &[],
        (store.sessions.findings.log_suppressed() + store.sessions.log_suppressed()) as f64,
    );
    let mut lost = Family::new(
        "gpumon_log_lost_total",
        "Log lines that never reached stderr since the daemon started: its reader stalled or went away (a closed pipe).",
        family::Kind::Counter,
        &[],
    );
    lost.add(&[], crate::util::stderr::lost_writes() as f64);
    let counts = &store.sessions.oom_counts;
    let mut ooms = Family::new(
        "gpumon_ooms_total",
        "oom events of every trainer since the daemon started, by the pattern the trainer's explanation gave (unknown without one).",
        family::Kind::Counter,
        &["pattern"],
    );
    for (p, n) in counts.by_pattern() {
        ooms.add(&[p.as_str()], n as f64);
    }
    let mut survived = Family::new(
        "gpumon_ooms_survived_total",
        "OOMs of every trainer since the daemon started that a sample came after: the trainer caught them and went on.",
        family::Kind::Counter,
        &[],
    );
    survived.add(&[], counts.survived as f64);
    let mut armed = Family::gauge(
        "gpumon_oom_armed_sessions",
        "Live trainer sessions armed now: asked to keep allocation history recording while an OOM is likely ([oom] config).",
        &[],
    );
    armed.add(&[], store.sessions.armed_count() as f64);
    for f in [
        leak, slope, eta, near, untracked, cache, cache_eta, firing, total, suppressed, lost, ooms,
        survived, armed,
    ] {
        f.finish(out);
    }
}
