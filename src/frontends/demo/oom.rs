//! How the leaking trainer ends, as a PyTorch trainer with the gpumon client ends: the caching
//! allocator's OOM observer fires (an `oom` event with the free memory it saw, and the OOM
//! explained as the client explains it when allocation history is recording), the
//! OutOfMemoryError goes uncaught, and the client's exit hook says why the process died and
//! closes without bye. No sample follows: the failing step never finished, so the `num_ooms`
//! torch counted at the OOM never reaches a sample; the event is the record of it.

use serde_json::{json, Value};

use super::attribution::{leak_site, TRAIN};
use super::profile::{device_free, Profile, TOTAL};
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

    /// The event as the daemon reads it: its parser, limits and all.
    fn daemon_reads(v: &Value) -> crate::core::trainer::Event {
        use crate::sources::ingest::protocol::{parse, Message};
        match parse(v.to_string().as_bytes()) {
            Ok(Message::Event(e)) => e,
            other => panic!("{v} parsed as {other:?}"),
        }
    }

    #[test]
    fn the_oom_is_explained_as_the_leak_the_profile_runs() {
        use crate::frontends::demo::attribution::{answer, Mark, Request};
        use crate::frontends::demo::profile::{MIB, STEPS_PER_SECOND};
        let p = Profile::Leak;
        let end = p.oom_after(0.0).unwrap();
        let e = daemon_reads(&event(p, end, 1.8e9));
        let x = e.explanation.as_deref().unwrap();
        println!("{}\n{:?}\n{:?}", x.message, x.reasons, x.remedies);
        assert_eq!(x.pattern, Pattern::Leak);
        assert_eq!(
            (x.request_bytes, e.alloc_bytes),
            (Some(ALLOC_BYTES), Some(ALLOC_BYTES))
        );
        assert_eq!((x.limit_bytes, e.alloc_limit), (Some(TOTAL), Some(TOTAL)));
        assert!(x.history);
        let asked = x.failing_site.as_ref().unwrap();
        assert_eq!(
            (asked.short(), asked.function.as_str()),
            ("train.py:49".into(), "run")
        );
        assert_eq!(asked.stack.last().map(|f| f.line), Some(69));

        // What holds the memory is the site the demo's attribution names, whole.
        let req = Request {
            id: 1,
            steps: 20,
            seconds: 60.0,
            top: 10,
        };
        let mark = |step| Mark {
            step,
            ts: 1.8e9,
            active: 0,
        };
        let named: crate::core::detect::attribution::Attribution =
            serde_json::from_value(answer(p, &req, mark(100), mark(120))).unwrap();
        let (top, site) = (x.top_live().unwrap(), &named.sites[0]);
        assert_eq!(x.live_sites.len(), 1);
        assert_eq!(
            (&top.file, top.line, &top.function, &top.stack),
            (&site.file, site.line, &site.function, &site.stack)
        );

        // Its bytes are what the floor gained since the run began: one block a step. Read off
        // the samples, that is the floor now less the floor at step 0, within the jitter.
        let last = last_instant(end);
        let (steps, now) = p.at(last);
        let (_, start) = p.at(0.0);
        let grown = now.allocated.unwrap() - start.allocated.unwrap();
        assert_eq!(top.blocks, steps);
        assert_eq!(steps, (end * STEPS_PER_SECOND) as u64);
        assert!(
            top.bytes.abs_diff(grown) < 64 * MIB as u64,
            "{} vs {grown}",
            top.bytes
        );
        // Most of what was allocated at the peak, and the cache had less free than was asked:
        // a leak, not fragmentation.
        assert_eq!(x.allocated_bytes, now.allocated_peak);
        let share = x.live_share(top);
        assert!(share > 0.6 && share < 0.9, "{share}");
        assert!(x.reserved_free_bytes.unwrap() < ALLOC_BYTES);
        assert!(x.largest_free_block_bytes <= x.reserved_free_bytes);

        // The client's words, with the profile's numbers.
        assert_eq!(
            x.reasons[0],
            format!(
                "live memory is dominated by blocks allocated at train.py:27 across {} steps and never freed",
                thousands(steps)
            )
        );
        assert!(
            x.remedies[0].starts_with(
                "store loss.item() or loss.detach() at train.py:27 instead of the tensor"
            ),
            "{}",
            x.remedies[0]
        );
        assert!(
            x.message
                .starts_with("leak: the 2.0 GiB request at train.py:49 in run failed with ")
                && x.message
                    .contains("allocated at train.py:27 in kept_outputs across"),
            "{}",
            x.message
        );

        // The next run's OOM counts its own steps, and the others never run out.
        let again = explanation(p, p.oom_after(end).unwrap()).unwrap();
        assert_eq!(again.top_live().unwrap().blocks, steps);
        assert!(explanation(Profile::Healthy, end).is_none());
        assert!(explanation(Profile::NearLimit, end).is_none());
    }

    #[test]
    fn human_reads_like_torch() {
        assert_eq!(human(2 << 30), "2.00 GiB");
        assert_eq!(human(TOTAL), "79.65 GiB");
        assert_eq!(human(512 << 20), "512.00 MiB");
        assert_eq!(human(100), "100 bytes");
    }
}
