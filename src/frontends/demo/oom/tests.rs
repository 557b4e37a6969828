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
        x.remedies[0]
            .starts_with("store loss.item() or loss.detach() at train.py:27 instead of the tensor"),
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
