"""The allocator at one point of a snapshot's history: what `explain`, `peak` and `trim` read.

A snapshot holds the segments as they are when it was taken, and a history (per device, its
`device_traces`) of what happened before. The state at an earlier entry (the OOM, the step's
peak) is the segments with the entries after it undone: an `alloc` since is not live yet, a
block freed since was still live, a segment mapped since was not reserved. Live blocks are then
charged to their sites (sites.py) with the steps they were allocated in.
"""

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from .sites import Frame, Site, as_dicts, block_frames, site_stack

__all__ = ["nonneg_int", "entries", "Block", "State", "segments", "undo_after", "largest_piece", "SiteTally",
           "tally_sites", "site_of"]


def nonneg_int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def entries(snapshot: Dict[str, Any], device: Optional[int]) -> Tuple[Optional[int], List[Dict[str, Any]]]:
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
                t = nonneg_int(e.get("time_us")) or 0
                if t >= best[1]:
                    best = (d, t)
    dev = best[0] if best[0] is not None else device
    if dev is None:
        # No OOM anywhere: the first device with a trace, for the live sites' allocation times.
        dev = next((i for i, t in enumerate(traces) if isinstance(t, list) and t), None)
    trace = traces[dev] if dev is not None and dev < len(traces) and isinstance(traces[dev], list) else []
    return dev, [e for e in trace if isinstance(e, dict)]


class Block:
    __slots__ = ("addr", "size", "frames")

    def __init__(self, addr: int, size: int, frames: Any) -> None:
        self.addr, self.size, self.frames = addr, size, frames


class State:
    """The allocator at the OOM: live blocks by address, free blocks, reserved bytes."""

    def __init__(self) -> None:
        self.live: Dict[int, Block] = {}
        self.anonymous_live = 0  # live bytes in blocks without an address (malformed), counted
        self.free: List[Tuple[int, int]] = []  # (addr, size) of inactive blocks
        self.reserved = 0
        self.segments = 0
        self.pending = 0  # active_pending_free: neither live nor yet free to reuse


def segments(snapshot: Dict[str, Any], device: Optional[int]) -> State:
    st = State()
    for seg in snapshot["segments"]:
        if device is not None and seg.get("device", device) != device:
            continue
        blocks = seg.get("blocks", [])
        st.segments += 1
        total = nonneg_int(seg.get("total_size"))
        st.reserved += total if total is not None else sum(b["size"] for b in blocks)
        addr = nonneg_int(seg.get("address"))
        for b in blocks:
            baddr = nonneg_int(b.get("address"))
            if baddr is None and addr is not None:
                baddr = addr  # blocks are laid out in order from the segment's start
            if addr is not None:
                addr += b["size"]
            if b["state"] == "active_allocated":
                if baddr is None:
                    st.anonymous_live += b["size"]
                else:
                    st.live[baddr] = Block(baddr, b["size"], block_frames(b))
            elif b["state"] == "active_pending_free":
                st.pending += b["size"]
            elif b["state"] == "inactive":
                st.free.append((baddr if baddr is not None else -1, b["size"]))
    return st


def undo_after(st: State, trace: List[Dict[str, Any]], oom: int) -> List[Tuple[int, int]]:
    """Takes back what happened after the OOM entry; returns the (addr, size) freed since."""
    allocs: Dict[int, Dict[str, Any]] = {}  # addr -> the last alloc entry before the OOM
    for e in trace[:oom]:
        addr = nonneg_int(e.get("addr"))
        if addr is not None and e.get("action") == "alloc":
            allocs[addr] = e
    freed: List[Tuple[int, int]] = []
    for e in reversed(trace[oom + 1:]):
        action, addr, size = e.get("action"), nonneg_int(e.get("addr")), nonneg_int(e.get("size")) or 0
        if addr is None:
            continue
        if action == "alloc":
            st.live.pop(addr, None)
        elif action == "free_completed":
            known = allocs.get(addr)
            st.live[addr] = Block(addr, size, known.get("frames") if known else None)
            freed.append((addr, size))
        elif action == "segment_alloc":
            st.reserved -= size
            st.free = [(a, n) for a, n in st.free if not addr <= a < addr + size]
        elif action == "segment_free":
            st.reserved += size
    return freed


def largest_piece(free: List[Tuple[int, int]], taken: List[Tuple[int, int]]) -> int:
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


@dataclass
class SiteTally:
    bytes: int = 0
    blocks: int = 0
    # Quoted: a class body evaluates its annotations, and collections.Counter[...] needs Python 3.9.
    stacks: "Counter[Tuple[Frame, ...]]" = field(default_factory=Counter)
    steps: Set[int] = field(default_factory=set)
    untimed: int = 0  # blocks allocated before the recorded history begins


def tally_sites(st: State, alloc_step: Dict[int, int]) -> Tuple[Dict[Frame, SiteTally], int]:
    sites: Dict[Frame, SiteTally] = {}
    no_stack = st.anonymous_live
    cache: Dict[int, Tuple[Frame, ...]] = {}
    for b in st.live.values():
        if not b.frames:
            no_stack += b.size
            continue
        stack = cache.get(id(b.frames))
        if stack is None:
            stack = cache[id(b.frames)] = site_stack(b.frames)
        t = sites.setdefault(stack[0], SiteTally())
        t.bytes += b.size
        t.blocks += 1
        t.stacks[stack] += 1
        step = alloc_step.get(b.addr)
        if step is None:
            t.untimed += 1
        else:
            t.steps.add(step)
    return sites, no_stack


def site_of(key: Frame, t: SiteTally) -> Site:
    stack = max(t.stacks, key=lambda s: (t.stacks[s], -len(s)))
    return Site(file=key[0], line=key[1], function=key[2], bytes=t.bytes, blocks=t.blocks,
                         stack=as_dicts(stack))
