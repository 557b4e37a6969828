"""Armed before the OOM: the client's half of the daemon's `arm` request (docs/protocol.md).

When an OOM is coming (near_limit firing, or a leak's forecast close), the daemon asks the
trainer to keep allocation history recording, so that the OOM observer's snapshot, when the OOM
comes, names its lines. Recording costs the trainer (a 1.6 ms H100 step was ~21% slower with
Python stacks), so it is bounded: the request's `seconds`, a `disarm`, the connection's end or
close(), whichever first. With `peak_after_steps`, after that many recorded steps the client takes
one snapshot and sends what was live at the highest point (snapshot/peak.py, imported then).

Recording is process-wide and shared with attribution windows: a window that comes while armed
rides on this recording (and leaves it on); an arm that comes while a window records starts its
own recording once the window has ended. A trainer that cannot record answers `unavailable` once
(and says so once in its log); the daemon then stops asking.
"""

import logging
import time
from typing import Any, Callable, Dict, Optional

from . import attribution, protocol
from .snapsource import SnapshotSource, Unavailable
from .transport import Transport

log = logging.getLogger("gpumon_client")

_said_unavailable = False  # the log line is said once per process


class Arm:
    __slots__ = ("request", "connection", "deadline", "started", "since_us", "step_from", "last_step", "seen", "peak_done")

    def __init__(self, request: protocol.ArmRequest, connection: int, deadline: float) -> None:
        self.request = request
        self.connection = connection
        self.deadline = deadline
        self.started = False
        self.since_us = 0
        self.step_from: Optional[int] = None
        self.last_step: Optional[int] = None
        self.seen = 0
        self.peak_done = request.peak_after_steps <= 0


class Armer:
    """One session's arming. `source` records and snapshots (its own instance: its start/stop
    must not be mistaken for an attribution window's)."""

    shares_recording = True  # an attribution window may ride on this recording (attribution.py)

    def __init__(self, source: SnapshotSource, transport: Transport, windows: Optional[attribution.Attributor] = None,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.transport = transport
        self.windows = windows  # the session's Attributor, whose open window defers a start
        self._clock = clock
        self._monotonic = monotonic
        self.armed: Optional[Arm] = None
        self.answers: Dict[str, int] = {}
        self.peaks = 0

    # --- called by the client --------------------------------------------------------------------

    def take(self, step: Optional[int]) -> None:
        """Handles the arm and disarm requests the transport queued (after a sample went out)."""
        queue = self.transport.arm_requests
        while queue:
            try:
                connection, req = queue.popleft()
            except IndexError:
                return
            try:
                self._handle(connection, req, step)
            except Exception as exc:  # a bug here must not reach the trainer, nor leave recording on
                self.stop()
                self._answer(connection, req.id, "failed", "arming raised %r" % (exc,))

    def at_step(self, step: Optional[int]) -> None:
        """A step boundary while armed (callers test `armed is not None` first)."""
        a = self.armed
        if a is None or (step is not None and step == a.last_step):
            return
        a.last_step = step
        try:
            t = self.transport
            if t.connects != a.connection or not t.connected or self._monotonic() >= a.deadline:
                if not a.started and a.deadline > 0.0:
                    self._answer(a.connection, a.request.id, "failed",
                                 "an attribution window held the recording until the arming's time cap")
                self.stop()  # the connection is gone (ids are per connection), or the time cap
                return
            if not a.started:
                if self._start(a, step):
                    self._answer(a.connection, a.request.id)  # recording now, as `armed` says
                return
            if not a.peak_done:
                a.seen += 1
                if a.seen >= a.request.peak_after_steps:
                    a.peak_done = True
                    self._send_peak(a, step)
        except Exception as exc:
            log.debug("gpumon: armed recording failed: %r", exc)
            self.stop()

    def stop(self, final: bool = False) -> None:
        """Recording off (what this armer switched on, and nothing else). An attribution window
        riding on the recording keeps it until the window ends, unless `final` (close())."""
        a = self.armed
        if not final and a is not None and a.started and self.windows is not None and self.windows.window is not None:
            a.deadline = 0.0  # stopped at the first step boundary after the window ended
            return
        self.armed = None
        if a is not None and a.started:
            attribution._safe_stop(self.source)
            with attribution._lock:
                if attribution._recording is self:
                    attribution._recording = None

    def stats(self) -> Dict[str, Any]:
        return {"armed": self.armed is not None, "answers": dict(self.answers), "peaks": self.peaks}

    # --- requests --------------------------------------------------------------------------------

    def _handle(self, connection: int, req: protocol.ArmRequest, step: Optional[int]) -> None:
        if req.problem is not None:
            self._answer(connection, req.id, "failed", req.problem)
            return
        if req.disarm:
            if self.armed is not None and self.armed.request.id == req.id:
                self.stop()
            return
        try:
            reason = self.source.unavailable()
        except Exception as exc:
            self._answer(connection, req.id, "failed", "checking for allocation history raised %r" % (exc,))
            return
        if reason:
            self._unavailable(connection, req.id, reason)
            return
        if self.armed is not None:
            self.stop(final=True)  # a new arming replaces the old one (the daemon sends one at a time)
        a = self.armed = Arm(req, connection, self._monotonic() + req.seconds)
        if self._start(a, step):
            self._answer(connection, req.id)
        # None: an attribution window records now; `armed` goes when this recording starts.

    def _start(self, a: Arm, step: Optional[int]) -> Optional[bool]:
        """Starts recording unless an attribution window records now (then at a later step).
        False when the arming ended (refused)."""
        with attribution._lock:
            if attribution._recording is not None and attribution._recording is not self:
                return None  # a window records: this starts once it has ended
            attribution._recording = self
        try:
            self.source.start(a.request.max_entries)
        except Exception as exc:
            attribution._safe_stop(self.source)
            with attribution._lock:
                if attribution._recording is self:
                    attribution._recording = None
            self.armed = None
            if isinstance(exc, Unavailable):
                self._unavailable(a.connection, a.request.id, str(exc))
            else:
                self._answer(a.connection, a.request.id, "failed", "recording allocation history was refused: %r" % (exc,))
            return False
        a.started = True
        a.since_us = int(self._clock() * 1e6)
        a.step_from = step
        return True

    def _send_peak(self, a: Arm, step: Optional[int]) -> None:
        ts = self._clock()
        try:
            from .snapshot import peak  # the snapshot tools load only when a peak is asked for

            found = peak.find(self.source.snapshot(), since_us=a.since_us)
        except Exception as exc:
            msg = protocol.peak(a.request.id, ts, None, [], a.step_from, step, error="failed",
                                detail="the peak's snapshot failed: %s: %s" % (type(exc).__name__, exc))
        else:
            msg = protocol.peak(a.request.id, ts, found.peak_bytes, peak.as_sites(found), a.step_from, step)
            attribution.fit_line(msg)
            self.peaks += 1
        self.transport.send_answer(msg, a.connection)

    def _unavailable(self, connection: int, rid: int, reason: str) -> None:
        global _said_unavailable
        if not _said_unavailable:
            _said_unavailable = True
            log.info("gpumon: allocation history cannot be kept for OOMs here (%s); OOMs are explained without their lines", reason)
        self._answer(connection, rid, "unavailable", reason)

    def _answer(self, connection: int, rid: int, error: Optional[str] = None, detail: Optional[str] = None) -> None:
        outcome = error or "armed"
        self.answers[outcome] = self.answers.get(outcome, 0) + 1
        self.transport.send_answer(protocol.armed(rid, self._clock(), error, detail), connection)
