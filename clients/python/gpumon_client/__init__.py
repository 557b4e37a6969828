"""gpumon client: pushes PyTorch CUDA allocator stats from a trainer to the gpumon daemon.

    import gpumon_client
    gpumon_client.attach(job="llama-ft")      # a sample per optimizer step, an event on OOM
    with gpumon_client.phase("eval"):
        evaluate()

Importing this package imports neither torch nor any trainer framework.
"""

from typing import Any

from ._version import __version__
from .hooks import Attachment, attach, detach
from .client import Client
from .phases import phase
from .reporter import Reporter
from .stats import StaticStatsSource, StatsSource, TorchStatsSource

__all__ = [
    "__version__",
    "attach",
    "detach",
    "phase",
    "Attachment",
    "Client",
    "Reporter",
    "StatsSource",
    "StaticStatsSource",
    "TorchStatsSource",
    "LightningCallback",
    "HFCallback",
]


def __getattr__(name: str) -> Any:
    # The callbacks subclass framework classes, so they are built on first lookup only.
    if name in ("LightningCallback", "HFCallback"):
        from . import callbacks

        return getattr(callbacks, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
