"""What gpu-check's trainer scripts share: their common flags, a small model, step pacing, and the
result file each writes for the driver (JSON, written at the end, atomically).

The scripts are ordinary PyTorch trainers: run under `python -m gpumon_client run` (or with the
client attached by a framework callback), they know nothing of gpumon beyond that. `--device cpu`
runs them without a GPU, for the self-test; the driver then injects allocator numbers
(sim/sitecustomize.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

MIB = 1 << 20
GIB = 1 << 30


def parser(description: str, seconds: float) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the self-test, no GPU needed")
    p.add_argument("--seconds", type=positive_float, default=seconds, help="how long to train (default %(default)s)")
    p.add_argument("--result", help="write the result here as JSON")
    p.add_argument("--stop-file", help="stop early (cleanly) once this file exists")
    p.add_argument("--seed", type=int, default=0)
    return p


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text)
    if not v > 0:
        raise argparse.ArgumentTypeError("%r must be more than 0" % text)
    return v


def fraction(text: str) -> float:
    v = positive_float(text)
    if v >= 1:
        raise argparse.ArgumentTypeError("%r must be below 1" % text)
    return v


def setup(args: argparse.Namespace) -> Any:
    """Imports torch, checks the device, seeds; returns the torch.device."""
    import torch

    torch.manual_seed(args.seed)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("%s: CUDA is not available to torch %s (use --device cpu for the self-test)" % (prog(), torch.__version__))
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def prog() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "trainer"


def device_total(torch: Any, device: Any) -> int:
    """Device memory in bytes; on CPU the simulated device's (GPU_CHECK_SIM_TOTAL, 16 GiB)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    return int(os.environ.get("GPU_CHECK_SIM_TOTAL", 16 * GIB))


def cap_allocator(p: argparse.ArgumentParser, torch: Any, device: Any, cap_gib: float) -> Tuple[int, int]:
    """Caps the caching allocator at `cap_gib` with set_per_process_memory_fraction (on CUDA);
    returns (cap, device total) in bytes. A cap not below the device total is a usage error."""
    total = device_total(torch, device)
    cap = int(cap_gib * GIB)
    if not 0 < cap < total:
        p.error("--cap %.2f GiB must be below the device's %.2f GiB" % (cap_gib, total / GIB))
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(cap / total, device)
    return cap, total


def mlp(torch: Any, width: int, depth: int, device: Any) -> Any:
    layers: List[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Run length, the stop file and step pacing in one place."""

    def __init__(self, seconds: float, stop_file: Optional[str] = None) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + seconds
        self.stop_file = stop_file
        self._next = self.t0

    def running(self) -> bool:
        if time.monotonic() >= self.deadline:
            return False
        return not (self.stop_file and os.path.exists(self.stop_file))

    def stopped_by_file(self) -> bool:
        return bool(self.stop_file and os.path.exists(self.stop_file))

    def pace(self, step_seconds: float) -> None:
        """Sleeps so that steps start `step_seconds` apart (no catching up after a slow one)."""
        self._next = max(self._next + step_seconds, time.monotonic())
        delay = self._next - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def write_result(path: Optional[str], result: Dict[str, Any]) -> None:
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def allocator_counters(torch: Any, device: Any) -> Dict[str, Any]:
    if device.type != "cuda":
        return {}
    s = torch.cuda.memory_stats(device)
    return {k: s.get(k) for k in ("num_alloc_retries", "num_ooms", "allocated_bytes.all.peak", "reserved_bytes.all.peak")}


def simulate_oom(alloc_bytes: int, limit: int, free: int) -> None:
    """CPU only: what the caching allocator's OOM observer would report (the client's observer
    is called as torch would call it), so the self-test exercises the OOM path end to end."""
    try:
        from gpumon_client import hooks

        observer = getattr(hooks, "_oom_observer", None)
        if observer is not None:
            observer(0, int(alloc_bytes), int(limit), int(free))
    except Exception:
        pass
