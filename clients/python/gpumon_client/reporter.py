"""Reporter: explicit reporting for hand-written loops (and the base of the trainer callbacks)."""

from typing import Any, Dict, Optional

from . import hooks as _attach
from .client import Client
from .protocol import KNOWN_STATS_KEYS
from .stats import StatsSource, TorchStatsSource, default_source


class Reporter:
    """Sends a sample when told to: `reporter.report(step)` once per training step.

    With attach() active and no source/socket of its own, a Reporter shares attach()'s
    connection (one session per device) and the optimizer hook stops sampling, since explicit
    steps label samples better than counted optimizer steps.
    """

    def __init__(
        self,
        job: Optional[str] = None,
        *,
        source: Optional[StatsSource] = None,
        socket: Optional[str] = None,
        device: Optional[int] = None,
        **client_kwargs: Any,
    ) -> None:
        attached = _attach.current()
        self._owns_client = True
        if attached is not None and attached.client is not None and source is None and socket is None:
            self.client: Client = attached.client
            self._owns_client = False
        else:
            if source is None:
                keys = client_kwargs.get("stats_keys", KNOWN_STATS_KEYS)
                source = default_source() or TorchStatsSource(device, keys=keys)
            self.client = Client(job, source=source, socket=socket, **client_kwargs)
        self.client.explicit_steps = True

    def report(self, step: Optional[int] = None, phase: Optional[str] = None) -> None:
        """One sample now; `phase` defaults to the current phase(). Each call is a step boundary
        for an open attribution window (one seen twice with the same `step` counts once)."""
        client = self.client
        client.at_step(step)
        client.sample(step=step, phase=phase)

    def mark(self, detail: str, **fields: Any) -> None:
        self.client.mark(detail, **fields)

    def snapshot(self, path: str) -> None:
        self.client.snapshot(path)

    def event(self, kind: str, **fields: Any) -> None:
        self.client.event(kind, **fields)

    def stats(self) -> Dict[str, Any]:
        return self.client.stats()

    def close(self, timeout: float = 0.5) -> None:
        """Ends the session (bye) unless it belongs to attach(), which ends it at exit."""
        if self._owns_client:
            self.client.close(timeout=timeout)

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
