"""Where samples come from. The client asks a StatsSource; tests and benches inject their own.

TorchStatsSource is the real one. It imports torch only when first used, so importing
gpumon_client never pulls torch in.
"""

import os
import sys
from typing import Any, Dict, Mapping, Optional, Tuple


class StatsSource:
    """What the client needs from the allocator. Subclass it, or pass any object with these methods."""

    def device_info(self) -> Dict[str, Any]:
        """hello fields: cuda_device, gpu_uuid, torch, allocator, expandable_segments (all optional)."""
        return {}

    def memory_stats(self) -> Mapping[str, Any]:
        """torch.cuda.memory_stats() for the reported device."""
        return {}

    def mem_get_info(self) -> Optional[Tuple[int, int]]:
        """(free, total) bytes on the device, or None."""
        return None


class StaticStatsSource(StatsSource):
    """Returns fixed (or caller-updated) values: for tests, benches and fixture generation."""

    def __init__(
        self,
        stats: Optional[Mapping[str, Any]] = None,
        mem_info: Optional[Tuple[int, int]] = None,
        info: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.stats: Mapping[str, Any] = dict(stats or {})
        self.mem_info = mem_info
        self.info = dict(info or {})

    def device_info(self) -> Dict[str, Any]:
        return dict(self.info)

    def memory_stats(self) -> Mapping[str, Any]:
        return self.stats

    def mem_get_info(self) -> Optional[Tuple[int, int]]:
        return self.mem_info


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
    """

    def __init__(self, device: Optional[int] = None) -> None:
        self._device = device
        self._torch: Any = None

    @staticmethod
    def available() -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            try:
                import torch  # noqa: F811 - optional dependency, imported on demand
            except Exception:
                return False
        try:
            return bool(torch.cuda.is_available())
        except Exception:
            return False

    def _mod(self) -> Any:
        if self._torch is None:
            import torch

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
            info["gpu_uuid"] = format_gpu_uuid(torch.cuda.get_device_properties(self.device).uuid)
        except Exception:
            pass
        try:
            info["allocator"] = str(torch.cuda.get_allocator_backend())
        except Exception:
            pass
        info["expandable_segments"] = expandable_segments_from_env()
        return info

    def memory_stats(self) -> Mapping[str, Any]:
        return self._mod().cuda.memory_stats(self.device)

    def mem_get_info(self) -> Optional[Tuple[int, int]]:
        free, total = self._mod().cuda.mem_get_info(self.device)
        return int(free), int(total)
