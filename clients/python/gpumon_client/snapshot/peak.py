"""What was live at the step's peak, by allocation site: pressure's question ("which activations
do I shrink to fit?"), read from one snapshot taken after some steps were recorded.

The history's entries since recording began are replayed backwards from the snapshot's live
blocks: after each entry the live total is known, the highest one is the peak, and undoing every
entry after it gives the live blocks at that moment. Each block is charged to its site by the
rule `diff` and `explain` use (the innermost frame in the user's code).
"""

from typing import Any, Dict, List, Optional

from .shape import validate
from .sites import Site
from . import state


class Peak:
    __slots__ = ("peak_bytes", "sites", "entries")

    def __init__(self, peak_bytes: int, sites: List[Site], entries: int) -> None:
        self.peak_bytes = peak_bytes
        self.sites = sites  # largest first
        self.entries = entries  # history entries replayed


def _time(e: Dict[str, Any]) -> int:
    t = e.get("time_us")
    return t if isinstance(t, int) and not isinstance(t, bool) else 0


def find(snapshot: Dict[str, Any], since_us: int = 0, device: Optional[int] = None, top: int = 10) -> Peak:
    """The peak among the history entries at or after `since_us` (Unix microseconds, as the
    entries' `time_us`); raises SnapshotError for a snapshot of the wrong shape and ValueError
    when no recorded entry falls in the window (nothing to replay)."""
    validate(snapshot)
    dev, trace = state.entries(snapshot, device)
    first = next((i for i, e in enumerate(trace) if _time(e) >= since_us), len(trace))
    if first == len(trace):
        raise ValueError("the history holds no entry since recording began (%d entries in all)" % len(trace))
    st = state.segments(snapshot, dev)
    total = sum(b.size for b in st.live.values()) + st.anonymous_live
    best, best_at = total, len(trace) - 1
    for i in range(len(trace) - 1, first - 1, -1):
        # `total` is the live total right after entry i; undo entry i for the one before it.
        if total > best:
            best, best_at = total, i
        e = trace[i]
        raw = e.get("size")
        size = raw if isinstance(raw, int) else 0
        if e.get("action") == "alloc":
            total -= size
        elif e.get("action") == "free_completed":
            total += size
    state.undo_after(st, trace, best_at)
    sites, _ = state.tally_sites(st, {})
    ranked = sorted(sites.items(), key=lambda kv: (-kv[1].bytes, -kv[1].blocks, kv[0]))
    return Peak(best, [state.site_of(k, t) for k, t in ranked[: max(0, top)]], len(trace) - first)


def as_sites(peak: Peak) -> List[Dict[str, Any]]:
    return [s.as_json() for s in peak.sites]
