//! A job as the outside world reads it (the API's `jobs`, `gpumon analyze`'s `jobs`, the TUI,
//! `gpumon status`): the field names are a contract (jobs.md). Every view is made by `verdict`
//! from its members' facts, so a live daemon, an offline replay and a merge of several daemons'
//! views all judge a job by one rule.

use serde::{Deserialize, Serialize};

use crate::core::detect::Kind;
use crate::core::model::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Some rank is live and no rank of this attempt failed.
    Running,
    /// A rank of this attempt ended by failure.
    Failed,
    /// Every rank ended, none by failure.
    Ended,
    /// A rank was stopped by a signal (Ctrl-C, `timeout`, scancel, preemption) and no failure
    /// came before it or after its cascade window: stopped, not failed.
    Stopped,
    /// A state this build does not know (a newer daemon's).
    #[serde(other)]
    Unknown,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Failed => "failed",
            JobState::Ended => "ended",
            JobState::Stopped => "stopped",
            JobState::Unknown => "unknown",
        }
    }
}

/// How a session ended by failure: an OOM it did not go on from, or a crash (no bye); or how
/// it was stopped (kind `stopped`: no bye, after the trainer said it received a signal).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub kind: Kind,
    /// The OOM's time, or the close's for a crash.
    pub ts: Timestamp,
    pub step: Option<u64>,
    pub message: String,
    /// crash: the exception the trainer said it died of (`RuntimeError: boom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<String>,
    /// stopped: the signal the trainer said it received (`SIGTERM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// A firing finding of one member, for the job's grouped findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberFinding {
    pub kind: Kind,
    pub message: String,
}

/// Memory a member's process holds on a GPU that is not its own (a stray CUDA context, often
/// on GPU 0, from a `torch.cuda` call before `set_device`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stray {
    pub gpu_uuid: String,
    #[serde(default, with = "crate::core::model::gpu_label")]
    pub gpu: Option<u32>,
    pub bytes: u64,
}

/// One session of the job, with the facts the verdict reads. A merge across daemons
/// concatenates these, so they carry everything the verdict needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub session: String,
    pub rank: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// `gpumon analyze`: the trace file this member was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    pub started: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The step peak (`allocated_bytes.all.peak` of the latest sample, else `allocated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    /// What the allocator could still take at the step peak; negative past the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_eta_seconds: Option<f64>,
    /// Its firing findings: now while it is live, as it ended once it ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<MemberFinding>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stray: Vec<Stray>,
}

/// The failure that took the job down, with where it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstFailure {
    pub rank: Option<u64>,
    pub session: String,
    pub kind: Kind,
    pub ts: Timestamp,
    pub step: Option<u64>,
    pub message: String,
    /// crash: the exception the rank said it died of; stopped: the signal it received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Failures on other hosts too close in time (within the clock tolerance), or on a host
    /// whose clock is off by more than it: which came first cannot be told. Their ranks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order_unknown: Vec<u64>,
}

/// Another rank's failure, and how long after the first it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRef {
    pub rank: Option<u64>,
    pub session: String,
    pub kind: Kind,
    pub ts: Timestamp,
    pub after_seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// One finding kind on several ranks of the job, as one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobFinding {
    pub kind: Kind,
    pub ranks: Vec<u64>,
    pub message: String,
}

/// The spread of the ranks' memory: the job dies with its first rank, so the highest peak and
/// the least headroom are what matter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobMemory {
    pub peak_min_bytes: Option<u64>,
    pub peak_median_bytes: Option<u64>,
    pub peak_max_bytes: Option<u64>,
    /// The rank with the highest peak.
    pub peak_max_rank: Option<u64>,
    /// Highest minus lowest peak.
    pub spread_bytes: Option<u64>,
    /// The least headroom of any live rank, and whose.
    pub headroom_bytes: Option<i64>,
    pub headroom_rank: Option<u64>,
    /// The rank whose OOM forecast is the soonest (the job's `oom_eta_seconds`).
    pub oom_eta_rank: Option<u64>,
    /// Ranks whose process holds memory on a GPU not their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stray: Vec<StrayRank>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StrayRank {
    pub rank: Option<u64>,
    pub session: String,
    #[serde(flatten)]
    pub stray: Stray,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    pub job: String,
    pub run_id: Option<String>,
    /// Whose job it is: the uid the daemon read off its sessions' socket (SO_PEERCRED), part of
    /// the job's identity with `job` and `run_id`. Null only for traces recorded before traces
    /// said it.
    #[serde(default)]
    pub uid: Option<u32>,
    pub world_size: Option<u64>,
    pub ranks: Vec<u64>,
    pub sessions: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    pub state: JobState,
    pub first_failure: Option<FirstFailure>,
    /// The first rank stopped by a signal, when the job was stopped (state `stopped`); the
    /// ranks that ended within the cascade window after it are its `consequences`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<FirstFailure>,
    /// Ranks that failed within the cascade window after the first failure, in order.
    #[serde(default)]
    pub consequences: Vec<FailureRef>,
    /// Failures past the cascade window: not explained by the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_failures: Vec<FailureRef>,
    /// Findings firing on its live ranks now, one per kind.
    pub findings: Vec<JobFinding>,
    /// A failed job: what was firing on its ranks when the first failure came (on a live rank,
    /// firing now; on one that ended, as it ended), one per kind: the cause behind the cause,
    /// kept after every rank is gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings_at_failure: Vec<JobFinding>,
    pub memory: JobMemory,
    pub oom_eta_seconds: Option<f64>,
    /// Times the run started again after a failure (torchelastic's restarts, or a rank of the
    /// same run saying hello again after the job failed).
    #[serde(default)]
    pub restarts: u64,
    /// The failure that ended the previous attempt, when the job restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_failure: Option<FirstFailure>,
    /// What did not add up: a rank past world_size, two processes claiming one rank, ranks
    /// that disagree on world_size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<String>,
    #[serde(default)]
    pub members: Vec<Member>,
    /// The cascade window this view was judged with (the daemon's `detect.job_cascade`): a
    /// merge across daemons judges with theirs, not its own default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cascade_seconds: Option<f64>,
}

impl JobView {
    pub fn identity(&self) -> super::Identity<'_> {
        super::Identity {
            job: &self.job,
            run_id: self.run_id.as_deref(),
            uid: self.uid,
        }
    }

    /// The job as one line names it: `llama-ft (uid 1000)` or `llama-ft (run 1234, uid 1000)`;
    /// two users' runs of one name and run id are two jobs, and read as two.
    pub fn name(&self) -> String {
        match (&self.run_id, self.uid) {
            (Some(r), Some(u)) => format!("{} (run {r}, uid {u})", self.job),
            (None, Some(u)) => format!("{} (uid {u})", self.job),
            _ => self.run_name(),
        }
    }

    /// The job's name and run without its uid: `llama-ft (run 1234)`, for a table whose own
    /// column says the uid.
    pub fn run_name(&self) -> String {
        match &self.run_id {
            Some(r) => format!("{} (run {r})", self.job),
            None => self.job.clone(),
        }
    }
}

pub use crate::core::detect::findings::who;
