"""Where attribution windows get allocation history and memory snapshots from.

TorchSnapshotSource is the real one: `torch.cuda.memory._record_memory_history` and `_snapshot`.
ReplaySnapshotSource hands out snapshot files (pickles of `_snapshot()`) instead, in order: for
tests and for machines without CUDA, where the real calls cannot run. Anything with the four
methods of SnapshotSource will do.
"""

import importlib
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple, Union


class Unavailable(Exception):
    """This trainer cannot record allocation history at all (no CUDA, a torch without it). The
    client answers `unavailable` and the daemon does not ask again."""


class SnapshotSource:
    """What an attribution window needs. Methods may raise; the window then answers `failed`
    (or `unavailable` for Unavailable) and always calls stop() after a successful start()."""

    def unavailable(self) -> Optional[str]:
        """Why history cannot be recorded here, or None when it can (checked per request)."""
        return None

    def start(self, max_entries: int) -> None:
        """Starts recording allocation history with Python stacks, keeping `max_entries`."""

    def snapshot(self) -> Dict[str, Any]:
        """The allocator's state now, as `torch.cuda.memory._snapshot()` returns it."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stops recording (what start() switched on, and nothing else)."""

    def fresh(self) -> "SnapshotSource":
        """A source for a second user of the same recording (arming beside attribution windows),
        whose start/stop are its own; sources without per-instance state return themselves."""
        return self


class TorchSnapshotSource(SnapshotSource):
    """torch.cuda.memory's allocation history, for one device.

    device: the CUDA device whose segments the snapshot keeps (the history is process-wide); an
    int, a callable giving one (resolved at the first snapshot, after the trainer picked its
    device), or None for every device.

    If the trainer records history itself already, the window uses that recording and leaves it
    on: stop() switches off only what start() switched on.
    """

    def __init__(self, device: Union[None, int, Callable[[], int]] = None) -> None:
        self._device = device
        self._ours = False

    @staticmethod
    def _modules() -> Tuple[Any, Any]:
        # An optional dependency, imported on demand (the trainer has usually imported it).
        torch = sys.modules.get("torch") or importlib.import_module("torch")
        return torch, importlib.import_module("torch.cuda.memory")

    def unavailable(self) -> Optional[str]:
        try:
            torch, memory = self._modules()
        except Exception as exc:
            return "torch is not importable (%s)" % (exc,)
        version = str(getattr(torch, "__version__", "?"))
        try:
            cuda = bool(torch.cuda.is_available())
        except Exception:
            cuda = False
        if not cuda:
            return "CUDA is not available to torch %s; allocation history needs a CUDA device" % version
        if getattr(memory, "_record_memory_history", None) is None or getattr(memory, "_snapshot", None) is None:
            return "torch %s has no allocation history (torch.cuda.memory._record_memory_history, torch 2.1 or later)" % version
        return None

    def start(self, max_entries: int) -> None:
        torch, memory = self._modules()
        enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        if enabled is not None and enabled():
            self._ours = False  # the trainer's own recording: used, not touched
            return
        try:
            memory._record_memory_history(max_entries=int(max_entries), context="alloc", stacks="python")
        except TypeError as exc:
            # torch 2.0 had another signature (enabled: bool, trace_alloc_max_entries, ...).
            raise Unavailable(
                "torch %s's _record_memory_history takes no max_entries/context/stacks (%s)"
                % (getattr(torch, "__version__", "?"), exc)
            )
        self._ours = True

    def snapshot(self) -> Dict[str, Any]:
        _torch, memory = self._modules()
        snap = memory._snapshot()
        device = self._device() if callable(self._device) else self._device
        return _one_device(snap, device) if device is not None else snap

    def fresh(self) -> "TorchSnapshotSource":
        return TorchSnapshotSource(self._device)

    def stop(self) -> None:
        if not self._ours:
            return
        self._ours = False
        _torch, memory = self._modules()
        memory._record_memory_history(enabled=None)


def _one_device(snap: Dict[str, Any], device: int) -> Dict[str, Any]:
    # One connection reports one device; the history is the whole process's.
    segments = snap.get("segments")
    traces = snap.get("device_traces")
    if not isinstance(segments, list) or not any(isinstance(s, dict) and s.get("device", device) != device for s in segments):
        return snap
    out = dict(snap)
    out["segments"] = [s for s in segments if isinstance(s, dict) and s.get("device", device) == device]
    if isinstance(traces, list):
        out["device_traces"] = [t if i == device else [] for i, t in enumerate(traces)]
    return out


class ReplaySnapshotSource(SnapshotSource):
    """Snapshot files handed out in turn (before, after, before, ...), loaded with
    gpumon_client.snapshot.load. Recording is only pretended; `calls` lists what was asked of it
    ("start", max_entries), ("snapshot", path), ("stop",), so tests can check the order."""

    def __init__(self, before: str, after: str) -> None:
        self.paths = [str(before), str(after)]
        self.calls: List[Tuple[Any, ...]] = []
        self.recording = False
        self._next = 0

    def fresh(self) -> "ReplaySnapshotSource":
        # Its own turn and call log: an arming must not move the attribution windows' replay.
        return ReplaySnapshotSource(*self.paths)

    def start(self, max_entries: int) -> None:
        self.calls.append(("start", int(max_entries)))
        self.recording = True
        self._next = 0  # every window starts with `before`, whatever happened to the last one

    def snapshot(self) -> Dict[str, Any]:
        from .snapshot.load import load

        path = self.paths[self._next % 2]
        self._next += 1
        self.calls.append(("snapshot", path))
        snapshot: Dict[str, Any] = load(path)  # checked: a snapshot is a dict
        return snapshot

    def stop(self) -> None:
        self.calls.append(("stop",))
        self.recording = False


_default: Optional[SnapshotSource] = None


def default_snapshots() -> Optional[SnapshotSource]:
    """The source set with testing.use_snapshots(); None: torch.cuda for torch stats sources."""
    return _default


def set_default_snapshots(source: Optional[SnapshotSource]) -> None:
    global _default
    _default = source
