//! How the leaking trainer ends, as a PyTorch trainer with the gpumon client ends: the caching
//! allocator's OOM observer fires (an `oom` event with the free memory it saw, and the OOM
//! explained as the client explains it when allocation history is recording), the
//! OutOfMemoryError goes uncaught, and the client's exit hook says why the process died and
//! closes without bye. No sample follows: the failing step never finished, so the `num_ooms`
//! torch counted at the OOM never reaches a sample; the event is the record of it.

use serde_json::{json, Value};

use super::attribution::{leak_site, TRAIN};
use super::job::device_free;
pub use super::profile::human;
use super::profile::{Profile, TOTAL};
use crate::core::detect::attribution::Frame;
use crate::core::detect::explanation::{Explanation, FailingSite, Pattern};
use crate::units::{bytes, thousands};

/// What the failing step tried to allocate: more than the ~1 GiB the allocator and the device
/// had left between them when the leak met the limit.
pub const ALLOC_BYTES: u64 = 2 << 30;
/// The client keeps this much of the exception's text (gpumon_client.client._excepthook).
const MAX_DIED: usize = 300;
/// The line whose request fails: the step's loss, computed from the output just kept at
/// train.py:27 (reached from `run` at line 48), one line later in `run`.
const FAILING_LINE: u64 = 49;

/// Seconds since the demo started of the run's last instant, when the failing step ran: a
/// microsecond before the run's end, below a step (200 ms) and far above f64's resolution here.
pub fn last_instant(end: f64) -> f64 {
    end - 1e-6
}

/// The `oom` event of the run that ends at `end` (seconds since the demo started), sent at
/// `ts`, with what the samples showed at that moment.
pub fn event(profile: Profile, end: f64, ts: f64) -> Value {
    let free = device_free(profile.gpu(), last_instant(end));
    let mut e = json!({
        "type": "event", "ts": ts, "kind": "oom", "alloc_bytes": ALLOC_BYTES,
        "device_free": free, "alloc_limit": TOTAL,
        "detail": format!("CUDA out of memory on device 0. Tried to allocate {} ({} allowed)",
            human(ALLOC_BYTES), human(TOTAL)),
    });
    if let Some(x) = explanation(profile, end) {
        e["explanation"] = serde_json::to_value(x).unwrap_or(Value::Null);
    }
    e
}

/// The OOM of the run that ends at `end` explained, as the client's `explain` reads it in the
/// allocator's snapshot: a leak, the request at train.py:49, and live memory held by the outputs
/// kept at train.py:27 (the site the demo's attribution names), one block a step since the run
/// began. History is recording: the client keeps it on for a trainer forecast to run out.
/// None for a profile that does not leak (it never runs out of memory).
pub fn explanation(profile: Profile, end: f64) -> Option<Explanation> {
    let per_step = profile.leak_per_step()?;
    let (steps, stats) = profile.at(last_instant(end));
    // The step failed at its peak, as in `exception`: that much was allocated, the rest of
    // reserved was cached, all of it in the one block the step's last activations left.
    let allocated = stats.allocated_peak.unwrap_or(0);
    let reserved = stats.reserved.unwrap_or(0);
    let cached = reserved.saturating_sub(allocated);
    let kept = leak_site(per_step, steps);
    let asked = FailingSite {
        file: TRAIN.into(),
        line: FAILING_LINE,
        function: "run".into(),
        stack: vec![
            Frame {
                file: TRAIN.into(),
                line: FAILING_LINE,
                function: "run".into(),
            },
            Frame {
                file: TRAIN.into(),
                line: 69,
                function: "<module>".into(),
            },
        ],
    };
    let share = kept.bytes as f64 * 100.0 / allocated.max(1) as f64;
    let reasons = vec![
        format!(
            "live memory is dominated by blocks allocated at {} across {} steps and never freed",
            kept.short(),
            thousands(kept.blocks)
        ),
        format!(
            "{} of the {} device was allocated and the cache held {} free, less than the {} asked",
            bytes(allocated),
            bytes(TOTAL),
            bytes(cached),
            bytes(ALLOC_BYTES)
        ),
    ];
    let remedies = vec![format!(
        "store loss.item() or loss.detach() at {} instead of the tensor, so each step's memory can be freed",
        kept.short()
    )];
    let message = format!(
        "leak: the {} request at {} in run failed with {share:.0}% of live memory ({}) allocated at {} in {} across {} steps and never freed",
        bytes(ALLOC_BYTES),
        asked.short(),
        bytes(kept.bytes),
        kept.short(),
        kept.function,
        thousands(kept.blocks)
    );
    Some(Explanation {
        pattern: Pattern::Leak,
        request_bytes: Some(ALLOC_BYTES),
        limit_bytes: Some(TOTAL),
        allocated_bytes: Some(allocated),
        reserved_bytes: Some(reserved),
        reserved_free_bytes: Some(cached),
        largest_free_block_bytes: Some(cached),
        history: true,
        failing_site: Some(asked),
        live_sites: vec![kept],
        reasons,
        remedies,
        message,
    })
}

/// Why the process died: the uncaught OutOfMemoryError as the client quotes it, torch's message
/// with the numbers of the run's last instant.
pub fn exception(profile: Profile, end: f64) -> String {
    let t = last_instant(end);
    let (_, stats) = profile.at(t);
    // The step failed at its peak: that much was allocated, the rest of reserved was cached.
    let allocated = stats.allocated_peak.unwrap_or(0);
    let reserved = stats.reserved.unwrap_or(0);
    let mut text = format!(
        "OutOfMemoryError: CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of {} of which {} is free. Including non-PyTorch memory, this process has {} memory in use. Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.",
        human(ALLOC_BYTES),
        human(TOTAL),
        human(device_free(profile.gpu(), t)),
        human(profile.nvml_used(t)),
        human(allocated),
        human(reserved.saturating_sub(allocated)),
    );
    // Every character above is ASCII, so any byte index is a char boundary.
    text.truncate(MAX_DIED);
    text
}

/// The client's last line before the connection closes without bye.
pub fn died(why: &str, ts: f64) -> Value {
    json!({"type": "event", "ts": ts, "kind": "mark", "detail": format!("trainer died: {why}")})
}

#[cfg(test)]
mod tests;
