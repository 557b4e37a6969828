"""Why a CUDA out-of-memory error happened, read from a `torch.cuda.memory` snapshot.

The three ways a run dies of CUDA OOM each have their own remedy, and one snapshot taken at the
OOM (`_snapshot()` in the allocator's OOM observer, or `_dump_snapshot()` right after catching
`torch.cuda.OutOfMemoryError`) tells them apart. The rules, in the order they are tried
(docs/detection.md, *OOM patterns*, gives the evidence for each):

1. pressure, when the single request is larger than the limit;
2. leak, when one allocation site holds at least 25% of live memory in blocks allocated across at
   least 8 different steps and never freed (the history's `alloc` entries say when each live block
   was allocated; steps are the optimizer steps torch annotates, else stretches of the trace
   separated by frees);
3. fragmentation, when the cache's free memory plus what the limit still allows would hold the
   request but no free block does (torch's own hint: "reserved but unallocated memory is large");
4. pressure, when the cache had less free memory than the request: what is live plus the
   request does not fit;
5. unknown otherwise (a free block large enough was there: the snapshot was likely taken after
   memory was freed), and `none` when the snapshot holds no OOM at all.

The state at the OOM is what counts. A snapshot taken after the exception unwound has seen frees
(and maybe allocations) since: the history entries after the `oom` entry are undone for the
totals and the live sites, and the largest free block is the largest piece left once what was
freed after the OOM is taken out of each free block.

A `file` is the frame's path as recorded; sites skip frames inside torch and the client, as
`diff` does (sites.py). The allocator's state at the OOM is state.py's reading; the text for
people is render.py's, the command line cli.py's (`python -m gpumon_client explain`), the wire
form wire.py's.
"""

import bisect
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .shape import SnapshotError, validate
from .sites import Frame, Site, as_dicts, basename, site_stack
from .state import SiteTally, entries, largest_piece, nonneg_int, segments, site_of, tally_sites, undo_after
from .units import fmt_bytes, fmt_limit

__all__ = ["Explanation", "explain", "LEAK_MIN_STEPS", "LEAK_MIN_SHARE", "REMEDIES"]

# A site counts as a leak from this many distinct steps on: fewer is too easily lazy state
# (optimizer moments made at the first step, a cache warmed over the first few batches).
LEAK_MIN_STEPS = 8
# ... and when it holds at least this share of live memory: a leak that small did not cause
# the OOM, whatever else it is.
LEAK_MIN_SHARE = 0.25


@dataclass
class Explanation:
    pattern: str  # pressure | fragmentation | leak | unknown | none
    request_bytes: Optional[int] = None
    limit_bytes: Optional[int] = None
    allocated_bytes: Optional[int] = None
    reserved_bytes: Optional[int] = None
    reserved_free_bytes: Optional[int] = None
    largest_free_block_bytes: Optional[int] = None
    history: bool = False
    failing_site: Optional[Dict[str, Any]] = None
    live_sites: List[Site] = field(default_factory=list)
    reasons: List[str] = field(default_factory=list)
    remedies: List[str] = field(default_factory=list)
    message: str = ""
    ooms_in_history: int = 0

    def as_json(self) -> Dict[str, Any]:
        return {
            "pattern": self.pattern,
            "request_bytes": self.request_bytes,
            "limit_bytes": self.limit_bytes,
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "reserved_free_bytes": self.reserved_free_bytes,
            "largest_free_block_bytes": self.largest_free_block_bytes,
            "history": self.history,
            "failing_site": self.failing_site,
            "live_sites": [s.as_json() for s in self.live_sites],
            "reasons": list(self.reasons),
            "remedies": list(self.remedies),
            "message": self.message,
        }


def _steps(snapshot: Dict[str, Any], trace: List[Dict[str, Any]], oom: int) -> Tuple[List[int], str]:
    """A step number for every trace entry up to the OOM, and what a step is. Optimizer steps
    when torch annotated them (Optimizer.step#...), else stretches separated by frees."""
    marks = sorted(
        a["time_us"] for a in snapshot.get("external_annotations") or ()
        if isinstance(a, dict) and a.get("stage") == "START" and str(a.get("name", "")).startswith("Optimizer.step")
        and nonneg_int(a.get("time_us")) is not None
    )
    if len(marks) >= 2:
        return [bisect.bisect_right(marks, nonneg_int(e.get("time_us")) or 0) for e in trace[:oom]], "steps"
    out, n, freeing = [], 0, False
    for e in trace[:oom]:
        if e.get("action") in ("free_requested", "free_completed"):
            freeing = True
        elif freeing:
            n, freeing = n + 1, False
        out.append(n)
    return out, "stretches of the history between frees"


# --- the verdict ------------------------------------------------------------------------------


def _where(site: Optional[Dict[str, Any]]) -> str:
    return "%s:%d" % (basename(site["file"]), site["line"]) if site else ""


REMEDIES = {
    "pressure": [
        "use a smaller micro-batch and accumulate gradients over more steps to keep the effective batch size",
        "recompute activations in backward instead of keeping them (activation checkpointing, torch.utils.checkpoint)",
        "use mixed precision (torch.autocast with bfloat16) to halve what activations take",
    ],
    "fragmentation": [
        "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so freed memory can be reused for blocks of any size",
        "keep tensor shapes steadier between steps (pad or bucket sequence lengths) so freed blocks fit the next request",
        "free or allocate up front the long-lived small tensors that pin the cache's segments",
    ],
    "leak": [
        "clear the list or cache that grows every step, or keep only what you need on the CPU (.item(), .cpu())",
    ],
    "unknown": [
        "record allocation history (torch.cuda.memory._record_memory_history(max_entries=100000)) and take the "
        "snapshot in the OOM observer (torch._C._cuda_attach_out_of_memory_observer), so the state at the OOM is read",
    ],
}


def explain(snapshot: Any, *, request_bytes: Optional[int] = None, limit_bytes: Optional[int] = None,
            device: Optional[int] = None, top: int = 10) -> Explanation:
    """Explains the latest OOM in `snapshot` (a `_snapshot()` dict). `request_bytes` and
    `limit_bytes` are what the OOM observer was told (used when the history has no `oom` entry,
    and for the limit, which a snapshot does not hold). Never raises on a snapshot of the wrong
    shape: that is an `unknown` with the reason."""
    try:
        validate(snapshot)
    except SnapshotError as exc:
        return _done(Explanation(pattern="unknown", request_bytes=request_bytes, limit_bytes=limit_bytes,
                                 reasons=["the snapshot cannot be read: %s" % exc.why]))
    dev, trace = entries(snapshot, device)
    ooms = [i for i, e in enumerate(trace) if e.get("action") == "oom"]
    oom = ooms[-1] if ooms else None
    st = segments(snapshot, dev)
    freed = undo_after(st, trace, oom) if oom is not None else []
    live_at = [e for e in trace[: oom if oom is not None else len(trace)]]
    steps, step_word = _steps(snapshot, trace, len(live_at))
    alloc_step: Dict[int, int] = {}
    for e, s in zip(live_at, steps):
        addr = nonneg_int(e.get("addr"))
        if addr is not None and e.get("action") == "alloc":
            alloc_step[addr] = s
    sites, _no_stack = tally_sites(st, alloc_step)
    allocated = sum(b.size for b in st.live.values()) + st.anonymous_live
    free_bytes = max(0, st.reserved - allocated - st.pending)
    ex = Explanation(
        pattern="unknown",
        request_bytes=request_bytes,
        limit_bytes=limit_bytes,
        allocated_bytes=allocated,
        reserved_bytes=st.reserved,
        reserved_free_bytes=free_bytes,
        largest_free_block_bytes=largest_piece(st.free, freed),
        history=bool(trace) or bool(sites),
        ooms_in_history=len(ooms),
    )
    ranked = sorted(sites.items(), key=lambda kv: (-kv[1].bytes, -kv[1].blocks, kv[0]))
    ex.live_sites = [site_of(k, t) for k, t in ranked[: max(0, top)]]
    entry = trace[oom] if oom is not None else None
    if entry is not None:
        if nonneg_int(entry.get("size")) is not None:
            ex.request_bytes = entry["size"]
        raw = entry.get("frames")
        if isinstance(raw, list) and raw:
            stack = site_stack(raw)
            f = stack[0]
            ex.failing_site = {"file": f[0], "line": f[1], "function": f[2], "stack": as_dicts(stack)}
    if entry is None and request_bytes is None:
        ex.pattern = "none"
        ex.reasons.append("the snapshot's history holds no OOM (no trace entry with action 'oom')"
                          if trace else "the snapshot has no allocation history, so no OOM to explain "
                          "(give the request with --request BYTES to classify one from the segments)")
        return _done(ex)
    if len(ooms) > 1:
        ex.reasons.append("the history holds %d OOMs; this explains the latest" % len(ooms))
    if not ex.history:
        ex.reasons.append("allocation history was not recording, so the lines are unknown and a leak cannot be "
                          "told from pressure; record it with torch.cuda.memory._record_memory_history()")
    elif ex.failing_site is None:
        ex.reasons.append("the OOM was raised with no Python frame on the stack (inside backward or another "
                          "C++ path), so the line that asked is unknown" if entry is not None else
                          "the history has no entry for this OOM, so the line that asked is unknown")
    if entry is not None and nonneg_int(entry.get("device_free")) is not None:
        device_free = entry["device_free"]
    else:
        device_free = None
    context, ex.reasons = ex.reasons, []
    _classify(ex, ranked, step_word, device_free, st.segments)
    ex.reasons += context  # the verdict's own reason first
    return _done(ex)


def _classify(ex: Explanation, ranked: List[Tuple[Frame, SiteTally]], step_word: str,
              device_free: Optional[int], segments: int) -> None:
    req = ex.request_bytes
    live = ex.allocated_bytes or 0
    limit = ex.limit_bytes
    free = ex.reserved_free_bytes or 0
    largest = ex.largest_free_block_bytes or 0
    if req is None:
        ex.reasons.append("the size of the request is unknown (no 'size' in the OOM's trace entry)")
        return
    asked = "the %s request%s" % (fmt_bytes(req), " at " + _where(ex.failing_site) if ex.failing_site else "")
    top = ex.live_sites[0] if ex.live_sites else None
    held = (" %.0f%% of live memory (%s) was allocated at %s." % (100.0 * top.bytes / max(live, 1), fmt_bytes(top.bytes), top.short())
            if top else "")
    if limit is not None and req > limit:
        ex.pattern = "pressure"
        ex.reasons.append("the single request (%s) is larger than the %s allowed" % (fmt_bytes(req), fmt_limit(limit)))
        ex.remedies.append("shrink the tensor asked for%s (batch size, sequence length) or raise the limit" % (
            " at " + _where(ex.failing_site) if ex.failing_site else ""))
        ex.message = "pressure: %s is larger than the whole %s allowed." % (asked, fmt_limit(limit))
        return
    leak = next(((k, t) for k, t in ranked if len(t.steps) >= LEAK_MIN_STEPS), None)
    if leak is not None and leak[1].bytes >= LEAK_MIN_SHARE * max(live, 1):
        (file, line, fn), t = leak
        where = "%s:%d" % (basename(file), line)
        share = 100.0 * t.bytes / max(live, 1)
        ex.pattern = "leak"
        span = "%d %s" % (len(t.steps), step_word)
        if t.untimed:
            span += " (and %d blocks from before the recorded history)" % t.untimed
        ex.reasons.append("live memory is dominated by blocks allocated at %s in %s: %.0f%% of it (%s in %d blocks), "
                          "allocated across %s and never freed" % (where, fn, share, fmt_bytes(t.bytes), t.blocks, span))
        ex.remedies.append("what %s allocates is kept across steps: if it is a loss or an output kept for logging, "
                           "store loss.item() or loss.detach() instead of the tensor (a kept tensor also keeps its "
                           "autograd graph)" % where)
        ex.remedies += REMEDIES["leak"]
        ex.message = "leak: %.0f%% of live memory (%s) was allocated at %s across %s and never freed; %s then found no room%s." % (
            share, fmt_bytes(t.bytes), where, span, asked, " under the %s allowed" % fmt_limit(limit) if limit else "")
        if largest < req <= free:
            ex.reasons.append("the cache was also fragmented: %s free, but no block of %s" % (fmt_bytes(free), fmt_bytes(req)))
        return
    if not segments:
        ex.reasons.append("the snapshot holds no memory segments for this device, so what held the memory is unknown")
        ex.remedies += REMEDIES["unknown"]
        return
    headroom = max(0, limit - (ex.reserved_bytes or 0)) if limit is not None else 0
    if free + headroom >= req > largest:
        ex.pattern = "fragmentation"
        ex.reasons.append("%s of the cache was free, more than the %s asked%s, but its largest free block is %s" % (
            fmt_bytes(free), fmt_bytes(req), " with what the limit still allows" if free < req else "",
            fmt_bytes(largest)))
        ex.remedies += REMEDIES["fragmentation"]
        ex.message = "fragmentation: %s found no free block large enough, though %s of the %s reserved was free " \
                     "(largest free block %s).%s" % (asked, fmt_bytes(free), fmt_bytes(ex.reserved_bytes or 0),
                                                     fmt_bytes(largest), held)
        return
    if largest < req:
        ex.pattern = "pressure"
        room = "the %s allowed" % fmt_limit(limit) if limit is not None else "what the allocator could get"
        ex.reasons.append("%s live plus the %s asked exceeds %s, and the cache had only %s free to give back" % (
            fmt_bytes(live), fmt_bytes(req), room, fmt_bytes(free)))
        if limit is None and device_free is not None and device_free >= req:
            ex.reasons.append("the device had %s free at the OOM, so a cap (set_per_process_memory_fraction) or "
                              "another limit was hit; give it with --limit to compare against it" % fmt_bytes(device_free))
        ex.remedies += REMEDIES["pressure"]
        ex.message = "pressure: %s did not fit: %s was live and the cache had only %s free.%s" % (
            asked, fmt_bytes(live), fmt_bytes(free), held)
        return
    ex.reasons.append("the cache held a free block of %s, enough for the %s asked: the snapshot was likely taken "
                      "after memory was freed, or the OOM was on another device" % (fmt_bytes(largest), fmt_bytes(req)))
    ex.remedies += REMEDIES["unknown"]


def _done(ex: Explanation) -> Explanation:
    if not ex.message:
        ex.message = "%s: %s" % (ex.pattern, ex.reasons[0] if ex.reasons else "nothing to explain")
    return ex
