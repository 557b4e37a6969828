"""A snapshot trimmed to what the explanation of its OOM needs, for torch's memory_viz.

A snapshot of a long run is too large for https://pytorch.org/memory_viz (its page lags past
~100 MB and fails past ~500 MB-1 GB). The trimmed file holds, for the device of the OOM:

- every segment and all its blocks (the allocator's state, complete: memory_viz checks that each
  segment's blocks add up to it);
- the history around the OOM: the last `window` entries before it, the OOM, everything after it
  (the frees as the exception unwound), and the `alloc` entry of every block alive at the OOM,
  however long before (the lines that held the memory);
- the optimizer-step annotations (how `explain` counts steps) and the allocator settings.

Other devices keep an empty history, so device numbers stay where they were. It is written with
pickle protocol 4 (memory_viz's page refuses 5) as plain data, frames shared as torch shares them.
With optimizer-step annotations in the snapshot, `explain` on the trimmed file gives the verdict
it gave on the whole one; without them it counts steps by stretches between frees, which a
shorter history may count differently.

`python -m gpumon_client explain SNAPSHOT.pickle --write-trimmed OUT.pickle` writes one (cli.py).
"""

import os
import pickle
from typing import Any, Dict, Optional, Tuple

from . import state

__all__ = ["DEFAULT_WINDOW", "trim", "write"]

DEFAULT_WINDOW = 2000  # history entries kept before the OOM


def trim(snapshot: Dict[str, Any], *, device: Optional[int] = None,
         window: int = DEFAULT_WINDOW) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """The trimmed snapshot and what it holds (segments, blocks, entries kept of how many)."""
    dev, trace = state.entries(snapshot, device)
    ooms = [i for i, e in enumerate(trace) if e.get("action") == "oom"]
    oom = ooms[-1] if ooms else len(trace)
    # Blocks alive at the OOM: the segments' live blocks with what happened after it undone.
    st = state.segments(snapshot, dev)
    if ooms:
        state.undo_after(st, trace, oom)
    live = set(st.live)
    keep = set(range(max(0, oom - window), len(trace)))
    last_alloc: Dict[int, int] = {}
    for i in range(min(oom, len(trace))):
        e = trace[i]
        if e.get("action") == "alloc":
            addr = state.nonneg_int(e.get("addr"))
            if addr is not None:
                last_alloc[addr] = i
    keep.update(i for a, i in last_alloc.items() if a in live)
    entries = [trace[i] for i in sorted(keep)]
    segments = [s for s in snapshot["segments"] if dev is None or s.get("device", dev) == dev]
    traces = snapshot.get("device_traces")
    n_dev = len(traces) if isinstance(traces, list) else 0
    out: Dict[str, Any] = {
        "segments": segments,
        "device_traces": [entries if d == dev else [] for d in range(max(n_dev, dev + 1) if dev is not None else n_dev)],
    }
    if "allocator_settings" in snapshot:
        out["allocator_settings"] = snapshot["allocator_settings"]
    annotations = snapshot.get("external_annotations")
    if isinstance(annotations, list):
        times = [t for t in (state.nonneg_int(e.get("time_us")) for e in entries) if t is not None]
        lo, hi = (min(times), max(times)) if times else (0, -1)
        out["external_annotations"] = [
            a for a in annotations
            if isinstance(a, dict) and (str(a.get("name", "")).startswith("Optimizer.step")
                                        or lo <= (state.nonneg_int(a.get("time_us")) or -1) <= hi)]
    info = {"segments": len(segments), "blocks": sum(len(s.get("blocks", ())) for s in segments),
            "entries": len(entries), "of_entries": len(trace), "device": dev if dev is not None else -1}
    return out, info


def write(path: str, snapshot: Dict[str, Any], *, device: Optional[int] = None,
          window: int = DEFAULT_WINDOW) -> Dict[str, int]:
    """Writes the trimmed snapshot to `path` (atomically); returns trim()'s info and its bytes."""
    trimmed, info = trim(snapshot, device=device, window=window)
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        pickle.dump(trimmed, f, protocol=4)
    os.replace(tmp, path)
    info["bytes"] = os.path.getsize(path)
    return info
