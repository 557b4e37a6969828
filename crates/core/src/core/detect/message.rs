//! Findings in words a person understands, and a short remedy from the usual PyTorch fixes.

mod explained;

use super::attribution::Attribution;
use super::peak::Peak;
use super::{Evidence, Kind};
use crate::core::categories::{remedies_text, split_text};
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
        Kind::CacheGrowth => {
            let slope = e.slope_bytes_per_step.unwrap_or(0.0);
            let mut m = format!(
                "reserved memory (PyTorch's cache) grows {}/step",
                bytes(slope.max(0.0) as u64)
            );
            if let Some(s) = e.onset_step {
                m.push_str(&format!(" since step {}", thousands(s)));
            }
            if let Some(a) = e.allocated_bytes {
                m.push_str(&format!(" while allocated stays at {}", bytes(a)));
            }
            match (e.growth_bytes, e.reserved_bytes) {
                (Some(g), Some(now)) => m.push_str(&format!(
                    " (+{} so far, {} reserved now)",
                    bytes(g),
                    bytes(now)
                )),
                (Some(g), None) => m.push_str(&format!(" (+{} so far)", bytes(g))),
                _ => {}
            }
            m.push_str(": the allocator keeps reserving memory it does not reuse");
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
            // A peak past the limit (a cap set below what the trainer already held) has no
            // headroom: "-9.90 GiB of headroom" reads as a typo, "over by" does not.
            match (e.headroom_bytes, e.alloc_limit) {
                (Some(h), Some(cap)) if h < 0 => parts.push(format!(
                    "the step peak is over the {} allowed by {}",
                    bytes_fine(cap),
                    bytes_fine(h.unsigned_abs())
                )),
                (Some(h), None) if h < 0 => parts.push(format!(
                    "the step peak is over what the allocator can hold by {}",
                    bytes(h.unsigned_abs())
                )),
                (Some(h), Some(cap)) => parts.push(format!(
                    "headroom at the step peak is {} of the {} allowed",
                    bytes_fine(h.unsigned_abs()),
                    bytes_fine(cap)
                )),
                (Some(h), None) => parts.push(format!(
                    "headroom at the step peak is {}",
                    bytes(h.unsigned_abs())
                )),
                (None, _) => {}
            }
            let mut m = if parts.is_empty() {
                "memory is near the device limit".into()
            } else {
                parts.join("; ")
            };
            m.push_str(&outside(e, "is"));
            m.push_str(&split(e));
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
            m.push_str(&split(e));
            if e.survived == Some(true) {
                m.push_str("; the run went on");
                if let Some(s) = e.survived_step {
                    m.push_str(&format!(" (step {})", thousands(s)));
                }
            }
            m
        }
        Kind::Crash => {
            let mut m = match &e.exception {
                Some(x) => format!("the trainer died of {x}"),
                None => "the trainer's connection closed without bye: it exited or was killed"
                    .to_string(),
            };
            if let Some(s) = e.step {
                m.push_str(&format!("; last step {}", thousands(s)));
            }
            if let Some(a) = e.allocated_bytes {
                m.push_str(&format!(", {} allocated", bytes(a)));
            }
            m
        }
        Kind::Stopped => {
            let mut m = format!(
                "the trainer was stopped by {}",
                e.signal.as_deref().unwrap_or("a signal")
            );
            if let Some(s) = e.step {
                m.push_str(&format!(" at step {}", thousands(s)));
            }
            m
        }
        // The finding words itself (orphan.rs: it knows the GPU, the pid and the time).
        Kind::OrphanedMemory => match e.orphan.as_deref() {
            Some(o) => format!(
                "{} held by a process that has exited",
                o.bytes.map_or_else(|| "memory".to_string(), bytes)
            ),
            None => "memory held by a process that has exited".into(),
        },
        Kind::Unknown => "a finding of a kind this version of gpumon does not know".into(),
    }
}

pub fn hint(kind: Kind, e: &Evidence) -> Option<String> {
    let sized = sized_remedies(kind, e);
    if let (Kind::Oom, Some(x)) = (kind, &e.explanation) {
        if let Some(h) = explained::hint(e, x) {
            return Some(match sized {
                Some(r) => format!("{h}; {r}"),
                None => h,
            });
        }
    }
    if let Some(r) = sized {
        return Some(r);
    }
    if kind == Kind::CacheGrowth {
        return Some(cache_hint(e));
    }
    Some(String::from(match kind {
        Kind::Leak => "memory that survives each step keeps growing: look for tensors kept across steps, e.g. `losses.append(loss)` keeps each graph alive; store `loss.item()` or `loss.detach()` instead",
        Kind::NearLimit | Kind::Oom if e.alloc_limit.is_some() => "this process may use only part of the GPU (torch.cuda.set_per_process_memory_fraction): raise the fraction if the device has room, or lower the batch size or sequence length, or use gradient checkpointing",
        Kind::NearLimit if e.retries.is_some_and(|r| r > 0) => "the caching allocator is flushing to fit: lower the batch size or sequence length, use gradient checkpointing, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        Kind::NearLimit => "little room is left at the step peak: lower the batch size or sequence length, or use gradient checkpointing",
        Kind::Fragmentation => "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) so freed blocks can be reused",
        Kind::Oom => "lower the batch size or sequence length, use gradient checkpointing or mixed precision; if a leak finding is also firing, fix the leak first",
        Kind::UntrackedGrowth => "memory_stats() and snapshots cannot see this memory, and empty_cache() does not return it: look for NCCL communicators or process groups made per step (new_group, a model wrapped again in DDP/FSDP), cuBLAS/cuDNN workspaces growing with new shapes (CUBLAS_WORKSPACE_CONFIG), CUDA graphs captured again and again, or a library allocating with raw cudaMalloc (CuPy, custom extensions)",
        Kind::Crash
        | Kind::Stopped
        | Kind::OrphanedMemory
        | Kind::CacheGrowth
        | Kind::Unknown => return None,
    }))
}

/// What to try for a cache that keeps growing: the settings in use first, when the client sent
/// them (quoted with escapes: they come from the trainer's environment).
fn cache_hint(e: &Evidence) -> String {
    let conf = match e.alloc_conf.as_deref() {
        Some(c) if !c.is_empty() => format!("PYTORCH_CUDA_ALLOC_CONF is {c:?}"),
        Some(_) => "PYTORCH_CUDA_ALLOC_CONF is empty".into(),
        None => "check PYTORCH_CUDA_ALLOC_CONF".into(),
    };
    format!(
        "{conf}: max_split_size_mb together with expandable_segments makes some torch versions reserve more every step (pytorch issue #123548), and cudaMallocAsync's graph pools grow where memory_reserved() does not count them; try the run without one of those settings or on another torch version; torch.cuda.empty_cache() once shows whether it is cache (reserved drops), but it is a diagnostic, not a cure"
    )
}

/// "; where the memory went at step 1,200: parameters 2.0 GiB, …": the latest measured split.
fn split(e: &Evidence) -> String {
    match &e.categories {
        Some(c) => format!("; where the memory went: {}", split_text(&c.split)),
        None => String::new(),
    }
}

/// The remedies the split sizes (categories.rs), with what the split cannot size: the cap to
/// raise, the allocator setting that stops flushing. None without a split that implies any.
fn sized_remedies(kind: Kind, e: &Evidence) -> Option<String> {
    if !matches!(kind, Kind::NearLimit | Kind::Oom) {
        return None;
    }
    let r = remedies_text(e.categories.as_deref()?);
    if r.is_empty() {
        return None;
    }
    let mut m = r;
    if e.alloc_limit.is_some() {
        m.push_str("; or raise torch.cuda.set_per_process_memory_fraction if the device has room");
    } else if kind == Kind::NearLimit && e.retries.is_some_and(|r| r > 0) {
        m.push_str("; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True stops the flushing");
    }
    Some(m)
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
pub fn forecast(e: &Evidence) -> String {
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

/// The clause a leak gets instead of a line when its trainer answered but named none: why no
/// line is named ("no line is named: the trainer cannot record allocation history (torch.cuda
/// is not available)"), so that every output of the finding says it, not only the TUI's detail.
/// None when the attribution names a line.
pub fn unattributed(a: &Attribution) -> Option<String> {
    let detail = a
        .detail
        .as_deref()
        .filter(|d| !d.is_empty())
        .map(|d| format!(" ({d})"))
        .unwrap_or_default();
    let why = match a.error.as_deref() {
        Some("unavailable") => {
            format!("the trainer cannot record allocation history{detail}")
        }
        Some("failed") => format!("recording allocation history failed{detail}"),
        Some("cut_short") => {
            "the trainer stopped reporting before its recording window ended".to_string()
        }
        Some(code) => format!("the trainer could not attribute ({code}){}", detail),
        None if a.top().is_some() => return None,
        None => match (a.step_from, a.step_to) {
            (Some(from), Some(to)) if to > from => format!(
                "no allocation site grew in steps {}\u{2013}{}",
                thousands(from),
                thousands(to)
            ),
            _ => "no allocation site grew while history was recording".to_string(),
        },
    };
    Some(no_line(&why))
}

/// "no line is named: {why}": the clause a leak without a line gets.
pub fn no_line(why: &str) -> String {
    format!("no line is named: {why}")
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

#[cfg(test)]
mod tests;
