//! gpumon_job_* families (jobs.md): a job's identity while it has live sessions, and when each
//! of its ranks ended by failure, kept for the crash hold so that PromQL finds the first failure
//! of a job across every node Prometheus scrapes.

use std::collections::BTreeMap;

use crate::core::model::now;
use crate::core::store::Store;
use crate::util::family::{self, Family};

pub fn job_families(store: &Store, out: &mut String) {
    let jobs = &store.jobs;
    let mut info = Family::gauge(
        "gpumon_job_info",
        "A job (the trainer sessions of one run: same job name, run_id and uid) with live sessions on this node; always 1.",
        &["job_name", "run_id", "uid", "world_size"],
    )
    .omitting_empty(&["run_id", "world_size"]);
    // Label sets, deduplicated: two jobs of one user, name and run id (a run that started
    // again after every rank ended) are one series.
    let mut live = BTreeMap::new();
    for j in jobs.iter().filter(|j| j.live()) {
        let world = j.world_size.map(|w| w.to_string()).unwrap_or_default();
        let key = (
            j.job.as_str(),
            j.run_id.as_deref().unwrap_or(""),
            j.uid.to_string(),
            world,
        );
        live.insert(key, ());
    }
    for (job, run, uid, world) in live.keys() {
        info.add(&[job, run, uid, world], 1.0);
    }
    let mut failed = Family::gauge(
        "gpumon_job_rank_failed_timestamp_seconds",
        "When a rank of the job ended by failure (an OOM it did not go on from, or a crash), Unix seconds; kept for detect.crash_hold. The smallest across nodes is the job's first failure.",
        &["job_name", "run_id", "uid", "rank", "kind"],
    )
    .omitting_empty(&["run_id"]);
    type Key<'a> = (&'a str, &'a str, String, String, &'a str);
    let mut first: BTreeMap<Key, f64> = BTreeMap::new();
    for (j, m, f) in jobs.failed_ranks(now(), store.sessions.crash_hold_seconds()) {
        let rank = m.rank.map(|r| r.to_string()).unwrap_or_default();
        let key = (
            j.job.as_str(),
            j.run_id.as_deref().unwrap_or(""),
            j.uid.to_string(),
            rank,
            f.kind.as_str(),
        );
        let ts = first.entry(key).or_insert(f.ts);
        *ts = ts.min(f.ts);
    }
    for ((job, run, uid, rank, kind), ts) in &first {
        failed.add(&[job, run, uid, rank, kind], *ts);
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
