//! Which sessions are one job (jobs.md, "Grouping" and "Across nodes"): the one rule the
//! daemon's registry, `merge` (several daemons' views) and the TUI's join all call.
//!
//! A job is the sessions with the same (`job`, `run_id`, uid), root's uid as any other. On one
//! daemon, sessions without a `run_id` join a job of that identity only while it has a live
//! session and the same `world_size` (their lives overlap). Across daemons, views join only
//! when they carry a run id: nothing says two nodes' `train.py` are one run.

/// What a job is named by: its `job`, `run_id` and uid (None only in views from a daemon that
/// did not say one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity<'a> {
    pub job: &'a str,
    pub run_id: Option<&'a str>,
    pub uid: Option<u32>,
}

/// The key several daemons' views of one run are joined under.
pub type RunKey = (String, String, Option<u32>);

impl Identity<'_> {
    /// Whether a session of this identity and `world` size joins a job of `job` on the same
    /// daemon, that job being `live` (asked only when needed) with `job_world` ranks.
    pub fn joins(
        &self,
        world: Option<u64>,
        job: &Identity,
        live: impl FnOnce() -> bool,
        job_world: Option<u64>,
    ) -> bool {
        self == job
            && match self.run_id {
                Some(_) => true,
                None => job_world == world && live(),
            }
    }

    /// The key under which views of this job from several daemons are one job; None without
    /// a run id, which is never joined across daemons.
    pub fn across_daemons(&self) -> Option<RunKey> {
        let run = self.run_id?;
        Some((self.job.to_string(), run.to_string(), self.uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(run_id: Option<&str>, uid: u32) -> Identity<'_> {
        Identity {
            job: "llama",
            run_id,
            uid: Some(uid),
        }
    }

    #[test]
    fn a_run_id_joins_whatever_the_size_and_life_another_uid_never() {
        let job = id(Some("r1"), 1000);
        assert!(id(Some("r1"), 1000).joins(Some(8), &job, || false, Some(4)));
        assert!(!id(Some("r1"), 0).joins(Some(8), &job, || true, Some(8)));
        assert!(!id(Some("r2"), 1000).joins(Some(8), &job, || true, Some(8)));
        assert!(!id(None, 1000).joins(Some(8), &job, || true, Some(8)));
    }

    #[test]
    fn without_a_run_id_only_a_live_job_of_the_same_size() {
        let job = id(None, 1000);
        assert!(id(None, 1000).joins(Some(2), &job, || true, Some(2)));
        assert!(!id(None, 1000).joins(Some(2), &job, || false, Some(2)));
        assert!(!id(None, 1000).joins(Some(4), &job, || true, Some(2)));
        assert!(!id(None, 1001).joins(Some(2), &job, || true, Some(2)));
    }

    #[test]
    fn across_daemons_only_a_run_id_joins() {
        assert_eq!(id(None, 0).across_daemons(), None);
        assert_eq!(
            id(Some("r1"), 0).across_daemons(),
            Some(("llama".into(), "r1".into(), Some(0)))
        );
        assert_ne!(
            id(Some("r1"), 0).across_daemons(),
            id(Some("r1"), 1000).across_daemons()
        );
    }
}
