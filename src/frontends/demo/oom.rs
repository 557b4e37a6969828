//! How the leaking trainer ends, as a PyTorch trainer with the gpumon client ends: the caching
//! allocator's OOM observer fires (an `oom` event with the free memory it saw), the
//! OutOfMemoryError goes uncaught, and the client's exit hook says why the process died and
//! closes without bye. No sample follows: the failing step never finished, so the `num_ooms`
//! torch counted at the OOM never reaches a sample; the event is the record of it.

use serde_json::{json, Value};

use super::profile::{device_free, Profile, TOTAL};

/// What the failing step tried to allocate: more than the ~1 GiB the allocator and the device
/// had left between them when the leak met the limit.
pub const ALLOC_BYTES: u64 = 2 << 30;
/// The client keeps this much of the exception's text (gpumon_client.client._excepthook).
const MAX_DIED: usize = 300;

/// Seconds since the demo started of the run's last instant, when the failing step ran: a
/// microsecond before the run's end, below a step (200 ms) and far above f64's resolution here.
pub fn last_instant(end: f64) -> f64 {
    end - 1e-6
}

/// The `oom` event of the run that ends at `end` (seconds since the demo started), sent at
/// `ts`, with what the samples showed at that moment.
pub fn event(profile: Profile, end: f64, ts: f64) -> Value {
    let free = device_free(profile.gpu(), last_instant(end));
    json!({
        "type": "event", "ts": ts, "kind": "oom", "alloc_bytes": ALLOC_BYTES,
        "device_free": free, "alloc_limit": TOTAL,
        "detail": format!("CUDA out of memory on device 0. Tried to allocate {} ({} allowed)",
            human(ALLOC_BYTES), human(TOTAL)),
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

/// Bytes the way torch's messages (and the client) write them: "2.00 GiB".
pub fn human(n: u64) -> String {
    let mut value = n as f64;
    for unit in ["bytes", "KiB", "MiB"] {
        if value < 1024.0 {
            return if unit == "bytes" {
                format!("{n} bytes")
            } else {
                format!("{value:.2} {unit}")
            };
        }
        value /= 1024.0;
    }
    format!("{value:.2} GiB")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontends::demo::profile::GIB;

    #[test]
    fn the_oom_sees_what_the_last_step_saw() {
        let p = Profile::Leak;
        let end = p.oom_after(0.0).unwrap();
        let e = event(p, end, 1_000.0);
        let free = e["device_free"].as_u64().unwrap();
        // The last step's sample, 200 ms before the end, saw the same device (its free memory
        // moves by one step's growth at most).
        let last_sample = device_free(p.gpu(), end - 0.2);
        assert!(
            free.abs_diff(last_sample) <= 72 << 20,
            "{free} vs {last_sample}"
        );
        // Not enough for the allocation: that is why it failed. About 1 GiB was left.
        assert!(free < ALLOC_BYTES);
        assert!(free as f64 > 0.9 * GIB, "{free}");
        let d = died(&exception(p, end), 1_000.0);
        let text = d["detail"].as_str().unwrap();
        let expected = format!("trainer died: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.65 GiB of which {} is free.", human(free));
        assert!(text.starts_with(&expected), "{text}");
        assert!(text.len() <= MAX_DIED + "trainer died: ".len());
    }

    #[test]
    fn human_reads_like_torch() {
        assert_eq!(human(2 << 30), "2.00 GiB");
        assert_eq!(human(TOTAL), "79.65 GiB");
        assert_eq!(human(512 << 20), "512.00 MiB");
        assert_eq!(human(100), "100 bytes");
    }
}
