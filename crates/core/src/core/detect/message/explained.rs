//! An OOM in words when the trainer explained it: which pattern, the line that asked, and what
//! held the memory, composed from the explanation's fields (never from the client's own
//! `message`, which is shown as the trainer's words elsewhere), and the remedy for that pattern.

use super::super::explanation::{Explanation, Pattern};
use super::super::Evidence;
use super::{held, share};
use crate::units::{bytes, bytes_fine, thousands};

/// "CUDA out of memory (fragmentation): tried to allocate 1.5 GiB at oomlib.py:37 with 3.58 GiB
/// of the 4.00 GiB allowed already reserved; 2.3 GiB of the cache was free but its largest free
/// block was 13.0 MiB; 95% of live memory was allocated at oomlib.py:32 at step 220".
pub fn describe(e: &Evidence, x: &Explanation) -> String {
    let pattern = match x.pattern {
        Pattern::None => Pattern::Unknown,
        p => p,
    };
    let mut m = format!("CUDA out of memory ({pattern})");
    let request = x.request_bytes.or(e.alloc_bytes);
    if let Some(r) = request {
        m.push_str(&format!(": tried to allocate {}", bytes(r)));
    }
    match (&x.failing_site, x.history) {
        (Some(site), _) => m.push_str(&format!(" at {}", site.short())),
        // History was on, yet the OOM's entry had no frame in the user's code.
        (None, true) => {
            m.push_str(" at an unknown line (no Python frame: raised inside backward, say)")
        }
        (None, false) => {}
    }
    let reserved = x.reserved_bytes.or(e.reserved_bytes);
    m.push_str(&held(e.alloc_limit, reserved, e.device_free));
    if let Some(why) = why(pattern, e, x, request) {
        m.push_str("; ");
        m.push_str(&why);
    }
    if let Some(top) = x.top_live() {
        m.push_str(&format!(
            "; {} of live memory was allocated at {}",
            share(x.live_share(top)),
            top.short()
        ));
    }
    if !x.history {
        m.push_str("; the lines are unknown: allocation history was not recording");
    }
    if let Some(s) = e.step {
        m.push_str(&format!(" at step {}", thousands(s)));
    }
    m
}

/// The clause that makes the pattern's case, from the numbers it rests on.
fn why(pattern: Pattern, e: &Evidence, x: &Explanation, request: Option<u64>) -> Option<String> {
    let limit = e.alloc_limit.or(x.limit_bytes);
    let allowed = |l: u64| match e.alloc_limit {
        Some(_) => format!("the {} allowed", bytes_fine(l)),
        None => format!("the {} the allocator may hold", bytes_fine(l)),
    };
    match pattern {
        Pattern::Fragmentation => match (x.reserved_free_bytes, x.largest_free_block_bytes) {
            (Some(free), Some(block)) => Some(format!(
                "{} of the cache was free but its largest free block was {}",
                bytes(free),
                bytes(block)
            )),
            (Some(free), None) => Some(format!(
                "{} of the cache was free but in no block large enough",
                bytes(free)
            )),
            _ => None,
        },
        Pattern::Pressure => match (request, limit) {
            (Some(r), Some(l)) if r > l => {
                Some(format!("the request alone is more than {}", allowed(l)))
            }
            (Some(r), Some(l)) => x.allocated_bytes.map(|a| {
                format!(
                    "the request plus the {} live ({}) is more than {}",
                    bytes(a),
                    bytes(r.saturating_add(a)),
                    allowed(l)
                )
            }),
            _ => None,
        },
        // The live-site clause that follows names what piled up.
        Pattern::Leak => Some("memory kept from earlier steps filled the cache".into()),
        Pattern::Unknown | Pattern::None => x.reasons.first().cloned(),
    }
}

/// The remedy for the pattern; None leaves the generic OOM hint.
pub fn hint(e: &Evidence, x: &Explanation) -> Option<String> {
    Some(match x.pattern {
        Pattern::Fragmentation => "the cache held enough free memory but no block large enough: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so freed memory can be reused for blocks of any size, and keep tensor shapes steadier between steps (pad or bucket variable lengths)".into(),
        Pattern::Pressure if e.alloc_limit.is_some() => return None,
        Pattern::Pressure => "the step needs more memory than there is: use a smaller micro-batch with gradient accumulation, activation checkpointing, or mixed precision (bf16/AMP)".into(),
        Pattern::Leak => {
            let at = match x.top_live() {
                Some(top) if top.function.is_empty() => format!(" at {}", top.short()),
                Some(top) => format!(" at {} in {}", top.short(), top.function),
                None => String::new(),
            };
            format!("memory that survives each step piled up{at}: keep no tensors across steps there, e.g. store `loss.item()` or `loss.detach()` instead of `loss`, which keeps its graph alive")
        }
        Pattern::Unknown | Pattern::None => return None,
    })
}
