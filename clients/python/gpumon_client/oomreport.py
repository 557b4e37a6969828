"""The explanation sent with an `oom` event, made in the allocator's OOM observer.

The observer runs after torch recorded the OOM in its allocation history and before it raises
OutOfMemoryError, so `torch.cuda.memory._snapshot()` there is the state at the OOM (PyTorch's
memory docs show the same pattern for dumping a snapshot at an OOM). Without history the snapshot
still has the segments, so the pattern is read from the free blocks; the lines are then unknown
and a reason says why. Nothing here raises: a failure becomes an `unknown` with its reason.

The analysis is the snapshot tools' (snapshot/explain.py, snapshot/wire.py): importing the client
does not load them; installing the OOM observer does (`prepare`), so the OOM itself imports nothing.
"""

from time import perf_counter
from typing import Any, Callable, Dict, Optional

from . import protocol

# Room left in the line for the event's own fields (ts, sizes, detail, seq).
_EVENT_ROOM = 2048

# What the last explanation cost, in seconds (for the benchmark and tests).
last_seconds = 0.0


def prepare() -> None:
    """Imports what at_oom explains with (the first import takes milliseconds)."""
    from .snapshot import explain, wire  # noqa: F401


def _torch_snapshot(device: Optional[int]) -> Dict[str, Any]:
    from .snapsource import TorchSnapshotSource

    return TorchSnapshotSource(device).snapshot()


def at_oom(
    device: Optional[int],
    alloc: Optional[int],
    limit: Optional[int],
    snapshot: Optional[Callable[[], Any]] = None,
    top: int = 10,
) -> Dict[str, Any]:
    """The wire form of the explanation of the OOM being raised now, fitted to one line."""
    global last_seconds
    t0 = perf_counter()
    from .snapshot.explain import Explanation, explain
    from .snapshot.wire import for_wire

    try:
        snap = snapshot() if snapshot is not None else _torch_snapshot(device)
    except Exception as exc:  # no CUDA, a torch without snapshots, a driver error
        ex = Explanation(
            pattern="unknown",
            request_bytes=alloc,
            limit_bytes=limit,
            reasons=["torch.cuda.memory._snapshot() raised at the OOM (%s: %s), so the allocator's state is unknown"
                     % (type(exc).__name__, exc)],
        )
        ex.message = "unknown: " + ex.reasons[0]
    else:
        try:
            ex = explain(snap, request_bytes=alloc, limit_bytes=limit, device=device, top=top)
        except Exception as exc:  # a snapshot shape explain() did not foresee: say so, never raise
            ex = Explanation(pattern="unknown", request_bytes=alloc, limit_bytes=limit,
                             reasons=["explaining the snapshot failed (%s: %s)" % (type(exc).__name__, exc)])
            ex.message = "unknown: " + ex.reasons[0]
    out = for_wire(ex, protocol.MAX_LINE - _EVENT_ROOM)
    last_seconds = perf_counter() - t0
    return out
