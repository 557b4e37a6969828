"""Why a CUDA out-of-memory error happened, read from a `torch.cuda.memory` snapshot.

    python -m gpumon_client explain SNAPSHOT.pickle [--json] [--top N] [--limit BYTES]
        [--write-trimmed OUT.pickle [--window N]] [--budget MIB]

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
`diff` does (snapdiff.is_user_file).
"""

import argparse
import bisect
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from . import snapdiff
from .snapdiff import fmt_bytes
from .snapload import SnapshotError, load, validate

__all__ = ["Explanation", "explain", "render", "main", "LEAK_MIN_STEPS", "LEAK_MIN_SHARE"]

# A site counts as a leak from this many distinct steps on: fewer is too easily lazy state
# (optimizer moments made at the first step, a cache warmed over the first few batches).
LEAK_MIN_STEPS = 8
# ... and when it holds at least this share of live memory: a leak that small did not cause
# the OOM, whatever else it is.
LEAK_MIN_SHARE = 0.25
MAX_NOTES = 8  # reasons and remedies sent to the daemon, at most (docs/protocol.md)

Frame = snapdiff.Frame


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
    live_sites: List[snapdiff.Site] = field(default_factory=list)
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


# --- reading the snapshot --------------------------------------------------------------------


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _entries(snapshot: Dict[str, Any], device: Optional[int]) -> Tuple[Optional[int], List[Dict[str, Any]]]:
    """The device whose trace holds the latest OOM (or `device`), and that trace's entries."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        return device, []
    best: Tuple[Optional[int], int] = (None, -1)
    for d, trace in enumerate(traces):
        if not isinstance(trace, list) or (device is not None and d != device):
            continue
        for e in trace:
            if isinstance(e, dict) and e.get("action") == "oom":
                t = _int(e.get("time_us")) or 0
                if t >= best[1]:
                    best = (d, t)
    dev = best[0] if best[0] is not None else device
    if dev is None:
        # No OOM anywhere: the first device with a trace, for the live sites' allocation times.
        dev = next((i for i, t in enumerate(traces) if isinstance(t, list) and t), None)
    trace = traces[dev] if dev is not None and dev < len(traces) and isinstance(traces[dev], list) else []
    return dev, [e for e in trace if isinstance(e, dict)]


class _Block:
    __slots__ = ("addr", "size", "frames")

    def __init__(self, addr: int, size: int, frames: Any) -> None:
        self.addr, self.size, self.frames = addr, size, frames


class _State:
    """The allocator at the OOM: live blocks by address, free blocks, reserved bytes."""

    def __init__(self) -> None:
        self.live: Dict[int, _Block] = {}
        self.anonymous_live = 0  # live bytes in blocks without an address (malformed), counted
        self.free: List[Tuple[int, int]] = []  # (addr, size) of inactive blocks
        self.reserved = 0
        self.segments = 0
        self.pending = 0  # active_pending_free: neither live nor yet free to reuse


def _segments(snapshot: Dict[str, Any], device: Optional[int]) -> _State:
    st = _State()
    for seg in snapshot["segments"]:
        if device is not None and seg.get("device", device) != device:
            continue
        blocks = seg.get("blocks", [])
        st.segments += 1
        total = _int(seg.get("total_size"))
        st.reserved += total if total is not None else sum(b["size"] for b in blocks)
        addr = _int(seg.get("address"))
        for b in blocks:
            baddr = _int(b.get("address"))
            if baddr is None and addr is not None:
                baddr = addr  # blocks are laid out in order from the segment's start
            if addr is not None:
                addr += b["size"]
            if b["state"] == "active_allocated":
                if baddr is None:
                    st.anonymous_live += b["size"]
                else:
                    st.live[baddr] = _Block(baddr, b["size"], snapdiff._block_frames(b))
            elif b["state"] == "active_pending_free":
                st.pending += b["size"]
            elif b["state"] == "inactive":
                st.free.append((baddr if baddr is not None else -1, b["size"]))
    return st


def _undo_after(st: _State, trace: List[Dict[str, Any]], oom: int) -> List[Tuple[int, int]]:
    """Takes back what happened after the OOM entry; returns the (addr, size) freed since."""
    allocs: Dict[int, Dict[str, Any]] = {}  # addr -> the last alloc entry before the OOM
    for e in trace[:oom]:
        addr = _int(e.get("addr"))
        if addr is not None and e.get("action") == "alloc":
            allocs[addr] = e
    freed: List[Tuple[int, int]] = []
    for e in reversed(trace[oom + 1:]):
        action, addr, size = e.get("action"), _int(e.get("addr")), _int(e.get("size")) or 0
        if addr is None:
            continue
        if action == "alloc":
            st.live.pop(addr, None)
        elif action == "free_completed":
            known = allocs.get(addr)
            st.live[addr] = _Block(addr, size, known.get("frames") if known else None)
            freed.append((addr, size))
        elif action == "segment_alloc":
            st.reserved -= size
            st.free = [(a, n) for a, n in st.free if not addr <= a < addr + size]
        elif action == "segment_free":
            st.reserved += size
    return freed


def _largest_piece(free: List[Tuple[int, int]], taken: List[Tuple[int, int]]) -> int:
    """The largest free piece once the `taken` ranges (freed after the OOM) are cut out."""
    taken = sorted(taken)
    starts = [a for a, _ in taken]
    best = 0
    for addr, size in free:
        if addr < 0:
            best = max(best, size)
            continue
        pos, largest = addr, 0
        for a, n in taken[bisect.bisect_left(starts, addr):]:
            if a >= addr + size:
                break
            largest = max(largest, a - pos)
            pos = max(pos, a + n)
        best = max(best, largest, addr + size - pos)
    return best


def _steps(snapshot: Dict[str, Any], trace: List[Dict[str, Any]], oom: int) -> Tuple[List[int], str]:
    """A step number for every trace entry up to the OOM, and what a step is. Optimizer steps
    when torch annotated them (Optimizer.step#...), else stretches separated by frees."""
    marks = sorted(
        a["time_us"] for a in snapshot.get("external_annotations") or ()
        if isinstance(a, dict) and a.get("stage") == "START" and str(a.get("name", "")).startswith("Optimizer.step")
        and _int(a.get("time_us")) is not None
    )
    if len(marks) >= 2:
        return [bisect.bisect_right(marks, _int(e.get("time_us")) or 0) for e in trace[:oom]], "steps"
    out, n, freeing = [], 0, False
    for e in trace[:oom]:
        if e.get("action") in ("free_requested", "free_completed"):
            freeing = True
        elif freeing:
            n, freeing = n + 1, False
        out.append(n)
    return out, "stretches of the history between frees"


# --- the verdict ------------------------------------------------------------------------------


@dataclass
class _SiteTally:
    bytes: int = 0
    blocks: int = 0
    # Quoted: a class body evaluates its annotations, and collections.Counter[...] needs Python 3.9.
    stacks: "Counter[Tuple[Frame, ...]]" = field(default_factory=Counter)
    steps: Set[int] = field(default_factory=set)
    untimed: int = 0  # blocks allocated before the recorded history begins


def _tally(st: _State, alloc_step: Dict[int, int]) -> Tuple[Dict[Frame, _SiteTally], int]:
    sites: Dict[Frame, _SiteTally] = {}
    no_stack = st.anonymous_live
    cache: Dict[int, Tuple[Frame, ...]] = {}
    for b in st.live.values():
        if not b.frames:
            no_stack += b.size
            continue
        stack = cache.get(id(b.frames))
        if stack is None:
            stack = cache[id(b.frames)] = snapdiff._site_stack(b.frames)
        t = sites.setdefault(stack[0], _SiteTally())
        t.bytes += b.size
        t.blocks += 1
        t.stacks[stack] += 1
        step = alloc_step.get(b.addr)
        if step is None:
            t.untimed += 1
        else:
            t.steps.add(step)
    return sites, no_stack


def _site(key: Frame, t: _SiteTally) -> snapdiff.Site:
    stack = max(t.stacks, key=lambda s: (t.stacks[s], -len(s)))
    return snapdiff.Site(file=key[0], line=key[1], function=key[2], bytes=t.bytes, blocks=t.blocks,
                         stack=[{"file": f, "line": n, "function": fn} for f, n, fn in stack])


def _where(site: Optional[Dict[str, Any]]) -> str:
    return "%s:%d" % (snapdiff._basename(site["file"]), site["line"]) if site else ""


def _cap(n: int) -> str:
    return "%.2f GiB" % (n / (1 << 30)) if n >= 1 << 30 else fmt_bytes(n)


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
    dev, trace = _entries(snapshot, device)
    ooms = [i for i, e in enumerate(trace) if e.get("action") == "oom"]
    oom = ooms[-1] if ooms else None
    st = _segments(snapshot, dev)
    freed = _undo_after(st, trace, oom) if oom is not None else []
    live_at = [e for e in trace[: oom if oom is not None else len(trace)]]
    steps, step_word = _steps(snapshot, trace, len(live_at))
    alloc_step: Dict[int, int] = {}
    for e, s in zip(live_at, steps):
        addr = _int(e.get("addr"))
        if addr is not None and e.get("action") == "alloc":
            alloc_step[addr] = s
    sites, _no_stack = _tally(st, alloc_step)
    allocated = sum(b.size for b in st.live.values()) + st.anonymous_live
    free_bytes = max(0, st.reserved - allocated - st.pending)
    ex = Explanation(
        pattern="unknown",
        request_bytes=request_bytes,
        limit_bytes=limit_bytes,
        allocated_bytes=allocated,
        reserved_bytes=st.reserved,
        reserved_free_bytes=free_bytes,
        largest_free_block_bytes=_largest_piece(st.free, freed),
        history=bool(trace) or bool(sites),
        ooms_in_history=len(ooms),
    )
    ranked = sorted(sites.items(), key=lambda kv: (-kv[1].bytes, -kv[1].blocks, kv[0]))
    ex.live_sites = [_site(k, t) for k, t in ranked[: max(0, top)]]
    entry = trace[oom] if oom is not None else None
    if entry is not None:
        if _int(entry.get("size")) is not None:
            ex.request_bytes = entry["size"]
        raw = entry.get("frames")
        if isinstance(raw, list) and raw:
            stack = snapdiff._site_stack(raw)
            f = stack[0]
            ex.failing_site = {"file": f[0], "line": f[1], "function": f[2],
                               "stack": [{"file": a, "line": b, "function": c} for a, b, c in stack]}
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
    if entry is not None and _int(entry.get("device_free")) is not None:
        device_free = entry["device_free"]
    else:
        device_free = None
    context, ex.reasons = ex.reasons, []
    _classify(ex, ranked, step_word, device_free, st.segments)
    ex.reasons += context  # the verdict's own reason first
    return _done(ex)


def _classify(ex: Explanation, ranked: List[Tuple[Frame, _SiteTally]], step_word: str,
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
        ex.reasons.append("the single request (%s) is larger than the %s allowed" % (fmt_bytes(req), _cap(limit)))
        ex.remedies.append("shrink the tensor asked for%s (batch size, sequence length) or raise the limit" % (
            " at " + _where(ex.failing_site) if ex.failing_site else ""))
        ex.message = "pressure: %s is larger than the whole %s allowed." % (asked, _cap(limit))
        return
    leak = next(((k, t) for k, t in ranked if len(t.steps) >= LEAK_MIN_STEPS), None)
    if leak is not None and leak[1].bytes >= LEAK_MIN_SHARE * max(live, 1):
        (file, line, fn), t = leak
        where = "%s:%d" % (snapdiff._basename(file), line)
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
            share, fmt_bytes(t.bytes), where, span, asked, " under the %s allowed" % _cap(limit) if limit else "")
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
        room = "the %s allowed" % _cap(limit) if limit is not None else "what the allocator could get"
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


# --- fitting into a protocol line ---------------------------------------------------------------


def for_wire(ex: Explanation, budget: int) -> Dict[str, Any]:
    """The explanation as the `oom` event carries it (docs/protocol.md): strings at most 512
    bytes, at most 8 reasons and remedies, sites and stacks trimmed (stacks first) so that
    `json.dumps` of the result is at most `budget` bytes."""
    d = ex.as_json()
    cap = snapdiff._cap
    d["reasons"] = [cap(r) for r in ex.reasons[:MAX_NOTES]]
    d["remedies"] = [cap(r) for r in ex.remedies[:MAX_NOTES]]
    d["message"] = cap(ex.message)
    if ex.failing_site is not None:
        fs = {k: cap(v) for k, v in ex.failing_site.items() if k != "stack"}
        fs["stack"] = [{k: cap(v) for k, v in f.items()} for f in ex.failing_site.get("stack", [])[: snapdiff.MAX_STACK]]
        d["failing_site"] = fs
    d["live_sites"] = []
    rest = budget - snapdiff._size(d)
    d["live_sites"] = snapdiff.fit([s.as_json() for s in ex.live_sites], max(2, rest + 2))
    while snapdiff._size(d) > budget and (d["reasons"] or (d["failing_site"] or {}).get("stack")):
        if d["failing_site"] and len(d["failing_site"]["stack"]) > 1:
            d["failing_site"]["stack"].pop()
        elif d["reasons"]:
            d["reasons"].pop()
        else:
            break
    return d


# --- text ---------------------------------------------------------------------------------------


def render(ex: Explanation, name: str = "SNAPSHOT", *, frames: int = 4, width: int = 100) -> str:
    lines = snapdiff._wrap(ex.message, width, "")
    lines.append("  in %s" % name)
    nums = []
    if ex.request_bytes is not None:
        nums.append("asked %s" % fmt_bytes(ex.request_bytes))
    if ex.limit_bytes is not None:
        nums.append("allowed %s" % _cap(ex.limit_bytes))
    if ex.allocated_bytes is not None:
        nums.append("live %s" % fmt_bytes(ex.allocated_bytes))
    if ex.reserved_bytes is not None:
        nums.append("reserved %s (%s free, largest free block %s)" % (
            fmt_bytes(ex.reserved_bytes), fmt_bytes(ex.reserved_free_bytes or 0), fmt_bytes(ex.largest_free_block_bytes or 0)))
    if nums:
        lines += snapdiff._wrap(", ".join(nums), width, "  ")
    for r in ex.reasons:
        lines += snapdiff._wrap("why: " + r, width, "  ")
    if ex.failing_site:
        lines.append("")
        lines.append("the line that asked:")
        for i, f in enumerate(ex.failing_site["stack"][:frames]):
            lines.append("  %s %s:%d in %s" % ("at" if i == 0 else "  ", f["file"], f["line"], f["function"]))
    for i, r in enumerate(ex.remedies):
        lines += snapdiff._wrap(("remedy: " if i == 0 else "or: ") + r, width, "  ")
    if ex.live_sites:
        live = max(ex.allocated_bytes or 0, sum(s.bytes for s in ex.live_sites)) or 1
        lines += ["", "%10s  %7s  %5s  %s" % ("live", "blocks", "share", "allocated at")]
        for s in ex.live_sites:
            lines.append("%10s  %7d  %4.0f%%  %s in %s" % (fmt_bytes(s.bytes), s.blocks, 100.0 * s.bytes / live, s.short(), s.function))
            for i, f in enumerate(s.stack[:frames]):
                lines.append("      %s %s:%d in %s" % ("at" if i == 0 else "  ", f["file"], f["line"], f["function"]))
            if len(s.stack) > frames:
                lines.append("         ... %d more frames" % (len(s.stack) - frames))
    return "\n".join(_printable(line) for line in lines) + "\n"


def _printable(text: str) -> str:
    # Paths and names come from the pickle: escape control characters, never print them raw.
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


# --- command line -------------------------------------------------------------------------------

PROG = "python -m gpumon_client explain"
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9}


def parse_bytes(text: str) -> int:
    t = text.strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not 0 <= value < 2 ** 50 or value != value:
        raise argparse.ArgumentTypeError("%r is not a byte count (e.g. 4294967296, 4GiB, 512MiB)" % text)
    return int(value * _UNITS[unit])


def main(argv: Optional[Iterable[str]] = None) -> int:
    """Exit status: 0 explained (whatever the pattern), 2 a file that could not be read or was refused."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Why a CUDA OOM happened (pressure, fragmentation or leak), the line that asked and what held "
                    "the memory, from a torch.cuda.memory snapshot taken at the OOM.",
        epilog="Exit status: 0 explained (any pattern, 'none' when the snapshot holds no OOM), 2 the file could "
               "not be read or was refused.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT.pickle")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.add_argument("--top", type=snapdiff._count(1), default=10, metavar="N", help="at most N live sites (default 10)")
    p.add_argument("--limit", type=parse_bytes, metavar="BYTES",
                   help="the allocator's cap, e.g. 4GiB (a snapshot does not hold it; torch's error says 'allowed')")
    p.add_argument("--request", type=parse_bytes, metavar="BYTES",
                   help="the failed request, for a snapshot whose history has no OOM entry")
    p.add_argument("--device", type=snapdiff._count(0), metavar="N", help="the CUDA device (default: the latest OOM's)")
    snapdiff.add_budget(p)
    p.add_argument("--write-trimmed", metavar="OUT.pickle",
                   help="also write the snapshot trimmed to what this explanation needs (the device's segments, "
                        "the history around the OOM, the allocations of what was alive at it), for "
                        "https://pytorch.org/memory_viz; its size is printed")
    p.add_argument("--window", type=snapdiff._count(0), default=None, metavar="N",
                   help="history entries kept before the OOM in the trimmed file (default 2000)")
    try:
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        # The trimmed file is read by memory_viz, which wants every field: keep them all then.
        snap = load(args.snapshot, budget=args.budget << 20, check=False,
                    keep="all" if args.write_trimmed else "explain")
    except SnapshotError as exc:
        sys.stderr.write("%s: %s\n" % (PROG, exc))
        return 2
    ex = explain(snap, request_bytes=args.request, limit_bytes=args.limit, device=args.device, top=args.top)
    if args.json:
        sys.stdout.write(json.dumps(ex.as_json(), indent=1) + "\n")
    else:
        sys.stdout.write(render(ex, args.snapshot))
    if args.write_trimmed:
        from . import snaptrim

        try:
            validate(snap, args.snapshot)
            info = snaptrim.write(args.write_trimmed, snap, device=args.device,
                                  window=snaptrim.DEFAULT_WINDOW if args.window is None else args.window)
        except (SnapshotError, OSError) as exc:
            sys.stderr.write("%s: cannot write the trimmed snapshot: %s\n" % (PROG, exc))
            return 2
        # On stderr under --json, so that stdout stays one JSON document.
        (sys.stderr if args.json else sys.stdout).write(snaptrim.describe(args.write_trimmed, info) + "\n")
    return 0
