"""Where samples come from. The client asks a StatsSource; tests and benches inject their own.

TorchStatsSource is the real one. It imports torch only when first used, so importing
gpumon_client never pulls torch in.
"""

import importlib
import logging
import os
import sys
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from .protocol import KNOWN_STATS_KEYS

log = logging.getLogger("gpumon_client")


class StatsSource:
    """What the client needs from the allocator. Subclass it, or pass any object with these methods."""

    def device_info(self) -> Dict[str, Any]:
        """hello fields: cuda_device, gpu_uuid, torch, allocator, expandable_segments, alloc_limit
        (all optional)."""
        return {}

    def memory_stats(self) -> Mapping[str, Any]:
        """torch.cuda.memory_stats() for the reported device (flat keys; only the ones sent suffice)."""
        return {}

    def mem_get_info(self) -> Optional[Tuple[int, int]]:
        """(free, total) bytes on the device, or None."""
        return None

    def tensor_device(self) -> str:
        """The device whose tensors count in the memory split (categories.py): a torch device
        string, by default the CUDA device of `device_info()` ("cuda:0")."""
        return cuda_device_name(self.device_info())


def cuda_device_name(info: Optional[Mapping[str, Any]]) -> str:
    """"cuda:N" for the `cuda_device` of hello fields; "cuda" (any CUDA device) without one."""
    index = (info or {}).get("cuda_device")
    return "cuda:%d" % index if isinstance(index, int) and not isinstance(index, bool) else "cuda"


INFO_KEYS = ("cuda_device", "gpu_uuid", "torch", "allocator", "expandable_segments", "alloc_limit")

_default: Optional[StatsSource] = None


def default_source() -> Optional[StatsSource]:
    """The source set with testing.use_source(), used where none is passed; None: torch.cuda."""
    return _default


def set_default_source(source: Optional[StatsSource]) -> None:
    global _default
    _default = source


class StaticStatsSource(StatsSource):
    """Returns fixed (or caller-updated) values: for tests, benches and fixture generation.

    info: hello fields (INFO_KEYS); `alloc_limit` there is also what alloc_limit() returns.
    tensor_device: the device whose tensors count in the memory split (categories.py), e.g. "cpu"
    in tests on CPU; by default the CUDA device of `info` ("cuda:0").
    """

    def __init__(
        self,
        stats: Optional[Mapping[str, Any]] = None,
        mem_info: Optional[Tuple[int, int]] = None,
        info: Optional[Dict[str, Any]] = None,
        tensor_device: Optional[str] = None,
    ) -> None:
        unknown = sorted(set(info or {}) - set(INFO_KEYS))
        if unknown:
            raise ValueError(
                "StaticStatsSource: unknown info key(s) %s; the hello fields are %s"
                % (", ".join(map(repr, unknown)), ", ".join(INFO_KEYS))
            )
        self.stats: Mapping[str, Any] = dict(stats or {})
        self.mem_info = mem_info
        self.info = dict(info or {})
        self._tensor_device = str(tensor_device) if tensor_device is not None else None

    def device_info(self) -> Dict[str, Any]:
        return dict(self.info)

    def memory_stats(self) -> Mapping[str, Any]:
        return self.stats

    def mem_get_info(self) -> Optional[Tuple[int, int]]:
        return self.mem_info

    def alloc_limit(self) -> Optional[int]:
        return self.info.get("alloc_limit")

    def tensor_device(self) -> str:
        return self._tensor_device or cuda_device_name(self.info)


def expandable_segments_from_env(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the allocator config turns expandable segments on (later settings win)."""
    env = os.environ if env is None else env
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF") or ""
    value = False
    for item in conf.split(","):
        key, _, val = item.partition(":")
        if key.strip() == "expandable_segments":
            value = val.strip().lower() in ("true", "1")
    return value


class TorchStatsSource(StatsSource):
    """torch.cuda for one device. `device=None` means the current device at first use.

    The device is resolved lazily because trainers usually call torch.cuda.set_device(local_rank)
    after attach(); by the first optimizer step it is settled.

    keys: the memory_stats() keys to read. They are picked straight from the allocator's nested
    stats (`memory_stats_as_nested_dict`), skipping the flatten-and-sort of every one of its ~130
    counters that `memory_stats()` does in Python on each call. None reads `memory_stats()` whole.
    """

    def __init__(self, device: Optional[int] = None, keys: Optional[Iterable[str]] = KNOWN_STATS_KEYS) -> None:
        self._device = device
        self._torch: Any = None
        self._nested: Any = None
        self._paths = None if keys is None else [(k, tuple(k.split("."))) for k in keys]

    @staticmethod
    def available() -> bool:
        try:
            # An optional dependency, imported on demand (the trainer has usually imported it).
            torch = sys.modules.get("torch") or importlib.import_module("torch")
        except Exception:
            return False
        try:
            return bool(torch.cuda.is_available())
        except Exception:
            return False

    def _mod(self) -> Any:
        if self._torch is None:
            import torch

            memory = importlib.import_module("torch.cuda.memory")
            self._nested = getattr(memory, "memory_stats_as_nested_dict", None)
            if getattr(memory, "get_per_process_memory_fraction", None) is None:
                _record_fractions(torch, memory)
            self._torch = torch
        return self._torch

    @property
    def device(self) -> int:
        if self._device is None:
            self._device = int(self._mod().cuda.current_device())
        return self._device

    def device_info(self) -> Dict[str, Any]:
        from .protocol import format_gpu_uuid

        torch = self._mod()
        info: Dict[str, Any] = {"cuda_device": self.device, "torch": str(getattr(torch, "__version__", "")) or None}
        try:
            uuid = getattr(torch.cuda.get_device_properties(self.device), "uuid", None)
            if uuid is not None:
                info["gpu_uuid"] = format_gpu_uuid(uuid)
            elif not _warned_uuid:
                _warn_no_uuid(info["torch"])
        except Exception:
            pass
        try:
            info["allocator"] = str(torch.cuda.get_allocator_backend())
        except Exception:
            pass
        info["expandable_segments"] = expandable_segments_from_env()
        try:
            info["alloc_limit"] = self.alloc_limit()
        except Exception:
            pass
        return info

    def memory_stats(self) -> Mapping[str, Any]:
        torch = self._mod()
        nested_fn, paths = self._nested, self._paths
        if nested_fn is None or paths is None:
            stats: Mapping[str, Any] = torch.cuda.memory_stats(self.device)
            return stats
        nested = nested_fn(self.device)
        out = {}
        for key, path in paths:
            value: Any = nested
            try:
                for part in path:
                    value = value[part]
            except (KeyError, TypeError, IndexError):
                continue  # a counter this torch does not have (older versions lack some)
            out[key] = value
        return out

    def mem_get_info(self) -> Optional[Tuple[int, int]]:
        free, total = self._mod().cuda.mem_get_info(self.device)
        return int(free), int(total)

    def tensor_device(self) -> str:
        return "cuda:%d" % self.device

    def alloc_limit(self) -> Optional[int]:
        """The caching allocator's cap on this device, from set_per_process_memory_fraction; None
        when no fraction below 1 is set. torch's rule: allowed = fraction x device total."""
        torch = self._mod()
        get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        fraction = get(self.device) if get is not None else _fractions.get(self.device)
        if fraction is None or fraction >= 1.0:
            return None
        _free, total = self._mod().cuda.mem_get_info(self.device)
        return int(fraction * total)


_warned_uuid = False


def _warn_no_uuid(version: Any) -> None:
    global _warned_uuid
    _warned_uuid = True
    log.warning(
        "gpumon: torch %s does not report the device UUID (get_device_properties().uuid); the daemon "
        "matches this trainer to its GPU by process id only",
        version,
    )


# Fractions set through set_per_process_memory_fraction, by device, on torch builds that have no
# getter for them (added in torch 2.6).
_fractions: Dict[int, float] = {}


def _record_fractions(torch: Any, memory: Any) -> None:
    setter = getattr(memory, "set_per_process_memory_fraction", None)
    if setter is None or getattr(setter, "_gpumon_wrapped", False):
        return

    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        setter(fraction, device)
        try:
            index = torch.cuda.current_device() if device is None else torch.cuda._get_device_index(device)
            _fractions[int(index)] = float(fraction)
        except Exception:
            pass

    set_per_process_memory_fraction.__doc__ = setter.__doc__
    set_per_process_memory_fraction._gpumon_wrapped = True  # type: ignore[attr-defined]
    memory.set_per_process_memory_fraction = set_per_process_memory_fraction
    if getattr(torch.cuda, "set_per_process_memory_fraction", None) is setter:
        torch.cuda.set_per_process_memory_fraction = set_per_process_memory_fraction
