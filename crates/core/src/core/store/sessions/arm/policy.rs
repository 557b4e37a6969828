//! The `[oom]` settings: when a trainer is asked to keep allocation history recording, so that
//! an OOM, when it comes, has its lines (docs/protocol.md, `arm`).

/// Most allocation records an arming may ask torch to keep (the protocol's limit).
pub const MAX_ENTRIES: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OomPolicy {
    /// Whether trainers are armed at all.
    pub arm: bool,
    /// Arm when a leak's OOM forecast is within this many seconds.
    pub arm_eta_seconds: f64,
    /// How long one arming lasts at most (the request's `seconds`): recording costs the trainer
    /// time every step, so it never runs open-ended.
    pub arm_seconds: f64,
    /// Allocation records torch keeps while armed.
    pub max_entries: u64,
    /// Steps recorded before the trainer reports what is live at the step peak; 0: not asked.
    pub peak_after_steps: u64,
    /// Seconds between two armings of one session, at least.
    pub rearm_seconds: f64,
}

impl Default for OomPolicy {
    fn default() -> Self {
        Self {
            arm: true,
            // An hour: about when the forecast alert (GpumonOOMForecast, under 2 h) is worth
            // acting on, and late enough that a slow leak does not keep a trainer recording.
            arm_eta_seconds: 3600.0,
            arm_seconds: 900.0,
            // At a few hundred allocations a step, enough for the steps before an OOM; each
            // record holds a Python stack in the trainer's memory.
            max_entries: 20_000,
            peak_after_steps: 20,
            rearm_seconds: 3600.0,
        }
    }
}
