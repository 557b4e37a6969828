//! gpumon_job_* families (jobs.md): a job's identity while it has live sessions, and when each
//! of its ranks ended by failure, kept for the crash hold so that PromQL finds the first failure
//! of a job across every node Prometheus scrapes.

use std::collections::BTreeMap;

use crate::core::model::now;
use crate::core::store::Store;
use crate::util::family::{self, Family};

pub fn job_families(store: &Store, out: &mut String) {
    let jobs = &store.sessions.jobs;
    let mut info = Family::gauge(
        "gpumon_job_info",
        "A job (the trainer sessions of one run: same job name and run_id) with live sessions on this node; always 1.",
        &["job", "run_id", "world_size"],
    )
    .omitting_empty(&["run_id", "world_size"]);
    // Label sets, deduplicated: two users' runs of one name and run id would repeat a series.
    let mut live = BTreeMap::new();
    for j in jobs.iter().filter(|j| j.live()) {
        let world = j.world_size.map(|w| w.to_string()).unwrap_or_default();
        live.insert(
            (j.job.as_str(), j.run_id.as_deref().unwrap_or(""), world),
            (),
        );
    }
    for (job, run, world) in live.keys() {
        info.add(&[job, run, world], 1.0);
    }
    let mut failed = Family::gauge(
        "gpumon_job_rank_failed_timestamp_seconds",
        "When a rank of the job ended by failure (an OOM it did not go on from, or a crash), Unix seconds; kept for detect.crash_hold. The smallest across nodes is the job's first failure.",
        &["job", "run_id", "rank", "kind"],
    )
    .omitting_empty(&["run_id"]);
    let mut first: BTreeMap<(&str, &str, String, &str), f64> = BTreeMap::new();
    for (j, m, f) in jobs.failed_ranks(now(), store.sessions.crash_hold_seconds()) {
        let rank = m.rank.map(|r| r.to_string()).unwrap_or_default();
        let key = (
            j.job.as_str(),
            j.run_id.as_deref().unwrap_or(""),
            rank,
            f.kind.as_str(),
        );
        let ts = first.entry(key).or_insert(f.ts);
        *ts = ts.min(f.ts);
    }
    for ((job, run, rank, kind), ts) in &first {
        failed.add(&[job, run, rank, kind], *ts);
    }
    let mut ungrouped = Family::new(
        "gpumon_jobs_ungrouped_total",
        "Trainer sessions not grouped into a job since the daemon started because a bound was reached (jobs per user, ranks per job); their own series are whole.",
        family::Kind::Counter,
        &[],
    );
    ungrouped.add(&[], jobs.ungrouped as f64);
    for f in [info, failed, ungrouped] {
        f.finish(out);
    }
}
