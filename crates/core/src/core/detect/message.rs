//! Findings in words a person understands, and a short remedy from the usual PyTorch fixes.

mod explained;

use super::attribution::Attribution;
use super::peak::Peak;
use super::{Evidence, Kind};
use crate::units::{bytes, bytes_fine, duration_coarse, thousands};

pub fn describe(kind: Kind, e: &Evidence) -> String {
    match kind {
        Kind::Leak => {
            let slope = e.slope_bytes_per_step.unwrap_or(0.0);
            let mut m = format!(
                "allocated floor grows {}/step",
                bytes(slope.max(0.0) as u64)
            );
            if let Some(s) = e.onset_step {
                m.push_str(&format!(" since step {}", thousands(s)));
            }
            if let Some(g) = e.growth_bytes {
                m.push_str(&format!(" (+{} so far)", bytes(g)));
            }
            m.push_str(&forecast(e));
            m
        }
        Kind::UntrackedGrowth => {
            let slope = e.slope_bytes_per_step.unwrap_or(0.0);
            let mut m = format!(
                "memory outside PyTorch's allocator grows {}/step",
                bytes(slope.max(0.0) as u64)
            );
            if let Some(s) = e.onset_step {
                m.push_str(&format!(" since step {}", thousands(s)));
            }
            match (e.growth_bytes, e.outside_allocator_bytes) {
                (Some(g), Some(now)) => {
                    m.push_str(&format!(" (+{} so far, {} now)", bytes(g), bytes(now)))
                }
                (Some(g), None) => m.push_str(&format!(" (+{} so far)", bytes(g))),
                _ => {}
            }
            m.push_str(&forecast(e));
            m
        }
        Kind::NearLimit => {
            let mut parts = Vec::new();
            if let Some(r) = e.retries.filter(|r| *r > 0) {
                parts.push(format!(
                    "the allocator retried cudaMalloc {r} time{} recently (it had to free its cache to fit)",
                    if r == 1 { "" } else { "s" }
                ));
            }
            match (e.headroom_bytes, e.alloc_limit) {
                (Some(h), Some(cap)) => parts.push(format!(
                    "headroom at the step peak is {} of the {} allowed",
                    signed_bytes(h, bytes_fine),
                    bytes_fine(cap)
                )),
                (Some(h), None) => parts.push(format!(
                    "headroom at the step peak is {}",
                    signed_bytes(h, bytes)
                )),
                (None, _) => {}
            }
            let mut m = if parts.is_empty() {
                "memory is near the device limit".into()
            } else {
                parts.join("; ")
            };
            m.push_str(&outside(e, "is"));
            m
        }
        Kind::Fragmentation => format!(
            "{:.0}% of reserved memory ({}) is cached but not allocated while {}",
            e.ratio.unwrap_or(0.0) * 100.0,
            bytes(e.fragmented_bytes.unwrap_or(0)),
            match e.alloc_limit {
                Some(cap) => format!("the process is near the {} allowed", bytes_fine(cap)),
                None => "the device is nearly full".into(),
            }
        ),
        Kind::Oom => {
            let mut m = match &e.explanation {
                Some(x) => explained::describe(e, x),
                None => plain_oom(e),
            };
            m.push_str(&outside(e, "was"));
            if e.survived == Some(true) {
                m.push_str("; the run went on");
                if let Some(s) = e.survived_step {
                    m.push_str(&format!(" (step {})", thousands(s)));
                }
            }
            m
        }
        Kind::Crash => {
            let mut m =
                "the trainer's connection closed without bye: it exited or was killed".to_string();
            if let Some(s) = e.step {
                m.push_str(&format!("; last step {}", thousands(s)));
            }
            if let Some(a) = e.allocated_bytes {
                m.push_str(&format!(", {} allocated", bytes(a)));
            }
            m
        }
        Kind::Unknown => "a finding of a kind this version of gpumon does not know".into(),
    }
}

pub fn hint(kind: Kind, e: &Evidence) -> Option<String> {
    if let (Kind::Oom, Some(x)) = (kind, &e.explanation) {
        if let Some(h) = explained::hint(e, x) {
            return Some(h);
        }
    }
    Some(String::from(match kind {
        Kind::Leak => "memory that survives each step keeps growing: look for tensors kept across steps, e.g. `losses.append(loss)` keeps each graph alive; store `loss.item()` or `loss.detach()` instead",
        Kind::NearLimit | Kind::Oom if e.alloc_limit.is_some() => "this process may use only part of the GPU (torch.cuda.set_per_process_memory_fraction): raise the fraction if the device has room, or lower the batch size or sequence length, or use gradient checkpointing",
        Kind::NearLimit if e.retries.is_some_and(|r| r > 0) => "the caching allocator is flushing to fit: lower the batch size or sequence length, use gradient checkpointing, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        Kind::NearLimit => "little room is left at the step peak: lower the batch size or sequence length, or use gradient checkpointing",
        Kind::Fragmentation => "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) so freed blocks can be reused",
        Kind::Oom => "lower the batch size or sequence length, use gradient checkpointing or mixed precision; if a leak finding is also firing, fix the leak first",
        Kind::UntrackedGrowth => "memory_stats() and snapshots cannot see this memory, and empty_cache() does not return it: look for NCCL communicators or process groups made per step (new_group, a model wrapped again in DDP/FSDP), cuBLAS/cuDNN workspaces growing with new shapes (CUBLAS_WORKSPACE_CONFIG), CUDA graphs captured again and again, or a library allocating with raw cudaMalloc (CuPy, custom extensions)",
        Kind::Crash | Kind::Unknown => return None,
    }))
}

/// "; 4.3 GiB of the process's memory is outside PyTorch's allocator": the part no allocator
/// setting frees (the CUDA context, NCCL, workspaces), when the ledger could say and it is some.
fn outside(e: &Evidence, verb: &str) -> String {
    match e.outside_allocator_bytes {
        Some(b) if b >= 1 << 20 => format!(
            "; {} of the process's memory {verb} outside PyTorch's allocator",
            bytes(b)
        ),
        _ => String::new(),
    }
}

/// "; at this rate the GPU is full in ~3 h (step ~40,000)": the forecast of a growing floor.
fn forecast(e: &Evidence) -> String {
    let (Some(secs), Some(steps)) = (e.oom_eta_seconds, e.oom_eta_steps) else {
        return String::new();
    };
    let full = match e.alloc_limit {
        Some(cap) => format!("the {} allowed is used up", bytes_fine(cap)),
        None => "the GPU is full".into(),
    };
    let mut m = format!("; at this rate {full} in ~{}", duration_coarse(secs));
    if let Some(at) = e.step.map(|s| s + steps) {
        m.push_str(&format!(" (step ~{})", thousands(round_step(at))));
    }
    m
}

/// An OOM as the allocator's numbers tell it, without the trainer's explanation.
fn plain_oom(e: &Evidence) -> String {
    let mut m = "CUDA out of memory".to_string();
    if let Some(a) = e.alloc_bytes {
        m.push_str(&format!(": tried to allocate {}", bytes(a)));
    }
    m.push_str(&held(e.alloc_limit, e.reserved_bytes, e.device_free));
    if let Some(s) = e.step {
        m.push_str(&format!(" at step {}", thousands(s)));
    }
    m
}

/// " with 4.64 GiB of the 4.75 GiB allowed already reserved": under a cap, the device's free
/// memory is beside the point (the cap was hit); without one, what the device had free.
fn held(cap: Option<u64>, reserved: Option<u64>, device_free: Option<u64>) -> String {
    match (cap, reserved, device_free) {
        (Some(cap), Some(r), _) => format!(
            " with {} of the {} allowed already reserved",
            bytes_fine(r),
            bytes_fine(cap)
        ),
        (Some(cap), None, _) => format!(" with the process capped at {}", bytes_fine(cap)),
        (None, _, Some(f)) => format!(" with {} free", bytes(f)),
        (None, _, None) => String::new(),
    }
}

/// One clause naming where a leak's memory was allocated: "93% of the growth in steps 610–730
/// was allocated at train.py:27 in kept_outputs". None when the trainer found no site or could
/// not attribute (its error is shown apart, not dressed up as a finding).
pub fn attributed(a: &Attribution) -> Option<String> {
    if a.error.is_some() {
        return None;
    }
    let top = a.top()?;
    let share = share(a.share(top));
    let of = match (a.step_from, a.step_to, a.seconds) {
        (Some(from), Some(to), _) if to > from => format!(
            "of the growth in steps {}\u{2013}{}",
            thousands(from),
            thousands(to)
        ),
        (_, _, Some(secs)) if secs > 0.0 => {
            format!("of the growth in the last {}", short_duration(secs))
        }
        _ => "of the recent growth".into(),
    };
    let mut m = format!("{share} {of} was allocated at {}", top.short());
    match top.function.as_str() {
        "" => {}
        "<module>" => m.push_str(" at module level"),
        f => m.push_str(&format!(" in {f}")),
    }
    Some(m)
}

/// One clause naming what held the memory at the step peak: "at the step peak 52% of live
/// memory (2.0 GiB) was allocated at model.py:88 in attention". None when the trainer found no
/// site or could not say (its error is shown apart).
pub fn at_peak(p: &Peak) -> Option<String> {
    if p.error.is_some() {
        return None;
    }
    let top = p.top()?;
    let mut m = format!(
        "at the step peak {} of live memory ({}) was allocated at {}",
        share(p.share(top)),
        bytes(top.bytes),
        top.short()
    );
    match top.function.as_str() {
        "" => {}
        "<module>" => m.push_str(" at module level"),
        f => m.push_str(&format!(" in {f}")),
    }
    Some(m)
}

/// A share 0..=1 as "93%"; one that rounds to 0 still was measured: "<1%" rather than "0%".
fn share(s: f64) -> String {
    let pct = s * 100.0;
    if pct > 0.0 && pct < 0.5 {
        "<1%".to_string()
    } else {
        format!("{:.0}%", pct)
    }
}

/// "61 s", "4 min", "2h05m": a recorded window, shown to the second while it is short.
fn short_duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=3599 => format!("{} min", s / 60),
        _ => duration_coarse(secs),
    }
}

/// Forecasts are not precise to the step: round to two significant digits.
fn round_step(n: u64) -> u64 {
    if n < 100 {
        return n;
    }
    let mag = 10u64.pow((n as f64).log10().floor() as u32 - 1);
    (n + mag / 2) / mag * mag
}

fn signed_bytes(v: i64, fmt: fn(u64) -> String) -> String {
    if v < 0 {
        format!("-{}", fmt(v.unsigned_abs()))
    } else {
        fmt(v as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leak_reads_like_the_contract_example() {
        let e = Evidence {
            slope_bytes_per_step: Some(2.0 * 1048576.0),
            onset_step: Some(610),
            growth_bytes: Some(400 << 20),
            // The detector's window is evidence only: the message measures from the onset.
            window_start_step: Some(700),
            window_growth_bytes: Some(150 << 20),
            oom_eta_seconds: Some(15_000.0),
            oom_eta_steps: Some(30_188),
            step: Some(812),
            ..Evidence::default()
        };
        assert_eq!(
            describe(Kind::Leak, &e),
            "allocated floor grows 2.0 MiB/step since step 610 (+400.0 MiB so far); at this rate the GPU is full in ~4h10m (step ~31,000)"
        );
    }

    #[test]
    fn pressure_and_ooms_say_what_lay_outside_the_allocator() {
        let e = Evidence {
            retries: Some(3),
            headroom_bytes: Some(200 << 20),
            outside_allocator_bytes: Some(4_617_089_843),
            ..Evidence::default()
        };
        assert_eq!(
            describe(Kind::NearLimit, &e),
            "the allocator retried cudaMalloc 3 times recently (it had to free its cache to fit); headroom at the step peak is 200.0 MiB; 4.3 GiB of the process's memory is outside PyTorch's allocator"
        );
        let oom = Evidence {
            alloc_bytes: Some(2 << 30),
            device_free: Some(1 << 30),
            step: Some(40_000),
            outside_allocator_bytes: Some(4_617_089_843),
            ..Evidence::default()
        };
        assert_eq!(
            describe(Kind::Oom, &oom),
            "CUDA out of memory: tried to allocate 2.0 GiB with 1.0 GiB free at step 40,000; 4.3 GiB of the process's memory was outside PyTorch's allocator"
        );
        // Nothing outside (or under a MiB): no clause.
        let none = Evidence {
            outside_allocator_bytes: Some(1000),
            ..e
        };
        assert!(!describe(Kind::NearLimit, &none).contains("outside"));
    }

    fn attribution(sites: Vec<(&str, u64, &str, u64)>) -> Attribution {
        use crate::core::detect::attribution::Site;
        Attribution {
            id: 1,
            ts: 0.0,
            finding: None,
            step_from: Some(610),
            step_to: Some(730),
            seconds: Some(61.2),
            total_growth_bytes: 128 << 20,
            sites: sites
                .into_iter()
                .map(|(file, line, function, bytes)| Site {
                    file: file.into(),
                    line,
                    function: function.into(),
                    bytes,
                    blocks: 1,
                    stack: vec![],
                    note: None,
                })
                .collect(),
            error: None,
            detail: None,
        }
    }

    #[test]
    fn attribution_names_the_top_site_with_its_share() {
        let kept = (119 << 20) + (1 << 19);
        let mut a = attribution(vec![
            ("/home/alice/proj/train.py", 27, "kept_outputs", kept),
            ("/home/alice/proj/train.py", 34, "eval_step", 8 << 20),
        ]);
        assert_eq!(
            attributed(&a).as_deref(),
            Some("93% of the growth in steps 610\u{2013}730 was allocated at train.py:27 in kept_outputs")
        );
        // Without steps, the window's length; without either, no window at all.
        (a.step_from, a.step_to) = (None, None);
        assert_eq!(
            attributed(&a).as_deref(),
            Some("93% of the growth in the last 61 s was allocated at train.py:27 in kept_outputs")
        );
        a.seconds = Some(600.0);
        assert!(attributed(&a).unwrap().contains("in the last 10 min was"));
        a.seconds = None;
        assert_eq!(
            attributed(&a).as_deref(),
            Some("93% of the recent growth was allocated at train.py:27 in kept_outputs")
        );
        // Steps that do not make a window fall back the same way.
        (a.step_from, a.step_to) = (Some(12_000), Some(12_000));
        assert!(attributed(&a)
            .unwrap()
            .starts_with("93% of the recent growth"));
        (a.step_from, a.step_to) = (Some(12_000), Some(13_500));
        assert!(attributed(&a)
            .unwrap()
            .contains("in steps 12,000\u{2013}13,500"));
    }

    #[test]
    fn the_peak_names_its_top_site_with_its_share_of_live_memory() {
        let mut p = crate::core::detect::peak::attention_example();
        assert_eq!(
            at_peak(&p).as_deref(),
            Some("at the step peak 50% of live memory (2.0 GiB) was allocated at model.py:88 in attention")
        );
        p.sites[0].function = "<module>".into();
        assert!(at_peak(&p)
            .unwrap()
            .ends_with("model.py:88 at module level"));
        p.error = Some("failed".into());
        assert_eq!(at_peak(&p), None);
        p.error = None;
        p.sites.clear();
        assert_eq!(at_peak(&p), None);
    }

    #[test]
    fn attribution_wording_at_the_edges() {
        let a = attribution(vec![("train.py", 5, "<module>", 1 << 10)]);
        assert_eq!(
            attributed(&a).as_deref(),
            Some("<1% of the growth in steps 610\u{2013}730 was allocated at train.py:5 at module level")
        );
        let a = attribution(vec![("train.py", 5, "", 128 << 20)]);
        assert_eq!(
            attributed(&a).as_deref(),
            Some("100% of the growth in steps 610\u{2013}730 was allocated at train.py:5")
        );
        // Nothing found, or nothing measured: no clause (the error is shown as such elsewhere).
        assert_eq!(attributed(&attribution(vec![])), None);
        let mut a = attribution(vec![("train.py", 27, "kept_outputs", 1 << 20)]);
        a.error = Some("cut_short".into());
        assert_eq!(attributed(&a), None);
    }

    #[test]
    fn formats() {
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(duration_coarse(59.0), "59s");
        assert_eq!(duration_coarse(90_000.0), "1d01h");
        assert_eq!(round_step(31_012), 31_000);
    }
}
