"""Shared helpers for the real-torch tests: optional imports, the injected allocator numbers,
child processes that run with them, and a tiny training loop.

Only the allocator's numbers are fake (torch.cuda.memory_stats needs a GPU); everything else is
the real torch, Lightning and transformers, running on CPU.
"""

import importlib
import json
import os
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT_ROOT = os.path.dirname(HERE)
REPO_ROOT = os.path.dirname(os.path.dirname(CLIENT_ROOT))


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


# In CI (scripts/check) a missing torch, Lightning or transformers is a failure, not a skip.
REQUIRE_TORCH = _flag("GPUMON_REQUIRE_TORCH")
REQUIRE_TOOLS = _flag("GPUMON_REQUIRE_TOOLS")


def require(module: str) -> Any:
    """Imports `module`, or skips (the calling test module, or the test whose fixture calls it)
    when it is absent; fails instead under GPUMON_REQUIRE_TORCH=1."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if REQUIRE_TORCH:
            pytest.fail("%s is required here (GPUMON_REQUIRE_TORCH=1): %s" % (module, exc), pytrace=False)
        pytest.skip("%s is not installed" % module, allow_module_level=True)


# What the injected source reports. "not.a.known.key" checks that only the known keys are sent.
STATS: Dict[str, int] = {
    "allocated_bytes.all.current": 1 << 30,
    "allocated_bytes.all.peak": 2 << 30,
    "reserved_bytes.all.current": 3 << 30,
    "active_bytes.all.current": 1 << 30,
    "inactive_split_bytes.all.current": 1 << 20,
    "requested_bytes.all.current": (1 << 30) - 4096,
    "num_alloc_retries": 0,
    "num_ooms": 0,
    "num_sync_all_streams": 0,
    "num_device_alloc": 12,
    "num_device_free": 1,
    "not.a.known.key": 5,
}
SENT_STATS = {k: v for k, v in STATS.items() if k != "not.a.known.key"}
MEM_INFO = (70 << 30, 80 << 30)
# The first GPU of the fake NVML library's two_gpus scenario, so the real daemon can join them.
GPU_UUID = "GPU-11111111-2222-3333-4444-555555555555"
ALLOC_LIMIT = 60 << 30
INFO: Dict[str, Any] = {"cuda_device": 0, "gpu_uuid": GPU_UUID, "alloc_limit": ALLOC_LIMIT}


def make_source() -> Any:
    from gpumon_client import StaticStatsSource

    return StaticStatsSource(stats=dict(STATS), mem_info=MEM_INFO, info=dict(INFO))


# Installed as sitecustomize.py for child processes (python -m gpumon_client run, torchrun
# workers): the scripts run unmodified, with only the allocator's numbers injected.
SITECUSTOMIZE = """\
import os
if os.environ.get("GPUMON_TEST_SOURCE"):
    import json
    from gpumon_client import StaticStatsSource, testing
    _spec = json.loads(os.environ["GPUMON_TEST_SOURCE"])
    testing.use_source(StaticStatsSource(stats=_spec["stats"], mem_info=tuple(_spec["mem_info"]), info=_spec["info"]))
"""


def source_env() -> Dict[str, str]:
    return {"GPUMON_TEST_SOURCE": json.dumps({"stats": STATS, "mem_info": list(MEM_INFO), "info": INFO})}


class Child:
    """The outcome of a child process: returncode, stdout, stderr, seconds."""

    def __init__(self, proc: "subprocess.CompletedProcess[str]", seconds: float) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.seconds = seconds

    def __repr__(self) -> str:
        return "exit %s after %.1fs\n--- stdout\n%s--- stderr\n%s" % (self.returncode, self.seconds, self.stdout, self.stderr)


def run_child(argv: Sequence[str], env: Dict[str, str], cwd: str, timeout: float = 120) -> Child:
    start = time.monotonic()
    proc = subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return Child(proc, time.monotonic() - start)


def of_type(msgs: List[Dict[str, Any]], kind: str) -> List[Dict[str, Any]]:
    return [m for m in msgs if m.get("type") == kind]


def steps(msgs: List[Dict[str, Any]], phase: Optional[str] = None) -> List[int]:
    return [m["step"] for m in of_type(msgs, "sample") if phase is None or m.get("phase") == phase]


def summary(msgs: List[Dict[str, Any]]) -> List[tuple]:
    """(type, step or kind, phase) per message: short enough for an assertion's message."""
    return [(m.get("type"), m.get("step", m.get("kind")), m.get("phase")) for m in msgs]


def check_sample_payload(sample: Dict[str, Any]) -> None:
    """A sample carries the injected allocator numbers: the known keys only, and mem_get_info."""
    assert sample["stats"] == SENT_STATS
    assert (sample["device_free"], sample["device_total"]) == MEM_INFO
    assert isinstance(sample["ts"], float) and abs(sample["ts"] - time.time()) < 600


def tiny_batch(torch: Any, seed: int, rows: int = 4, cols: int = 8) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen)


def train_step(torch: Any, model: Any, opts: Sequence[Any], seed: int, set_to_none: bool = True) -> Any:
    """One plain training step: zero_grad, forward, backward, step every optimizer in `opts`."""
    for opt in opts:
        opt.zero_grad(set_to_none=set_to_none)
    loss = model(tiny_batch(torch, seed)).pow(2).mean()
    loss.backward()
    for opt in opts:
        opt.step()
    return loss


def run_cuda_init_callbacks(torch: Any, start: int) -> None:
    """Runs what torch.cuda._lazy_init runs right after CUDA initialises: the callbacks queued
    since index `start`. (No GPU here, so CUDA never initialises by itself.)"""
    for queued in list(torch.cuda._queued_calls[start:]):
        queued[0]()


def capture_oom_observers(torch: Any, monkeypatch: Any) -> "tuple[list, list]":
    """The OOM observers the client hands torch, each also passed on to the real registration
    (which raises without an NVIDIA driver; the client must cope): (handed, raised)."""
    real = torch._C._cuda_attach_out_of_memory_observer
    handed: list = []
    raised: list = []

    def spy(fn: Any) -> None:
        handed.append(fn)
        try:
            real(fn)
        except Exception as exc:
            raised.append(exc)
            raise

    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", spy)
    return handed, raised
