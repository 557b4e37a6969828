"""Attribution windows: the client's half of the daemon's `attribute` request (docs/protocol.md).

On a request the client starts recording allocation history, lets one step go by recorded (so what
every step allocates carries a stack in both snapshots), takes the first snapshot at the next step
boundary, lets `steps` steps or `seconds` seconds pass (whichever first), takes the second
snapshot, switches recording off, diffs the two in the trainer (gpumon_client.snapshot.diff) and sends
an `attribution` with the top sites, trimmed to fit one protocol line.

Cost: recording made a 1.6 ms H100 step ~21% slower, so it runs only for a window. While no window
is open a step costs the caller's `attributor.window is not None` test; while one is, a step costs
a comparison of step numbers and a clock read, plus the two snapshots (5-7 ms each on an H100) and
the diff at the window's edges.

One window per session at a time: a request while one is open is answered `failed` ("a window is
already open"), so the daemon hears at once rather than after its timeout. Recording is
process-wide, so one window per process: another session's request meanwhile is `failed` too.
Recording is switched off on every path: the window's end, a snapshot or the diff raising, the
connection lost (the answer could go nowhere: ids are per connection), close() (`cut_short`) and
the process dying of an exception (`cut_short`, then the `trainer died` mark).
"""

import logging
import math
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, Optional, Union

from . import protocol
from .messages import Attribution, Peak
from .snapsource import SnapshotSource, Unavailable
from .transport import Transport

log = logging.getLogger("gpumon_client")

_MARGIN = 1024  # bytes of the line limit left unused, for what a re-encoding may add

_lock = threading.Lock()
# Whose window (an Attributor) or arming (arming.Armer) records allocation history, process-wide.
_recording: Optional[object] = None


class Window:
    """One open window. `before` is None until the first snapshot (one recorded step in)."""

    __slots__ = ("request", "connection", "last_step", "before", "step_from", "t_from", "seen", "steps", "deadline", "stage", "stopped")

    def __init__(self, request: protocol.AttributeRequest, connection: int, step: Optional[int]) -> None:
        self.request = request
        self.connection = connection
        self.last_step = step
        self.before: Optional[Dict[str, Any]] = None
        self.step_from: Optional[int] = None
        self.t_from = 0.0
        self.seen = 0  # step boundaries since the first snapshot
        self.steps = request.steps if request.steps is not None else math.inf
        self.deadline = math.inf
        self.stage = "the first snapshot"  # what runs next, for the answer when it raises
        self.stopped = False


class Attributor:
    """A session's attribution windows. `transport` queues the requests (transport.requests) and
    sends the answers (transport.send_answer); `source` records and snapshots."""

    def __init__(
        self,
        source: SnapshotSource,
        transport: Transport,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.transport = transport
        self._clock = clock
        self._monotonic = monotonic
        self.window: Optional[Window] = None
        self.answers: Dict[str, int] = {}  # answers sent, by outcome: sites, unavailable, failed, cut_short
        self.lost = 0  # windows closed unanswered because their connection went away
        self.last_detail: Optional[str] = None  # why the last window did not give sites
        _live.add(self)

    # --- called by the client --------------------------------------------------------------------

    def take(self, step: Optional[int]) -> None:
        """Handles the requests the transport queued; called right after a sample went out."""
        requests = self.transport.requests
        while requests:
            try:
                connection, request = requests.popleft()
            except IndexError:
                return
            try:
                self._open(connection, request, step)
            except Exception as exc:  # a bug here must not reach the trainer, nor leave recording on
                self._abort(self.window, exc)

    def at_step(self, step: Optional[int]) -> None:
        """A step boundary while a window is open (callers test `window is not None` first)."""
        w = self.window
        if w is None:
            return
        if step is not None:
            if step == w.last_step:
                return  # the same step seen twice (a callback's eval sample, a second caller)
            w.last_step = step
        try:
            t = self.transport
            if t.connects != w.connection or not t.connected:
                self.lost += 1
                self._stop(w)
                return
            if w.before is None:
                w.before = self.source.snapshot()
                w.stage = "the second snapshot"
                w.step_from = step
                w.t_from = self._monotonic()
                seconds = w.request.seconds
                w.deadline = w.t_from + seconds if seconds is not None else math.inf
                return
            w.seen += 1
            if w.seen >= w.steps or self._monotonic() >= w.deadline:
                self._finish(w, step)
        except Exception as exc:
            self._abort(w, exc)

    def cut_short(self, detail: str) -> None:
        """The trainer stops reporting (close, detach, an exception): recording off, and the open
        window and any request not yet started answered `cut_short` while the connection is up."""
        w = self.window
        if w is not None:
            begun = w.before is not None
            self._stop(w)
            if begun:
                where = "%d step(s) into the window" % w.seen
            else:
                where = "before the window began (recording, its first step not over)"
            self._answer(
                w.connection,
                w.request,
                "cut_short",
                "%s, %s" % (detail, where),
                step_from=w.step_from if begun else None,
                step_to=w.last_step if begun else None,
                seconds=round(self._monotonic() - w.t_from, 3) if begun else None,
            )
        requests = self.transport.requests
        while requests:
            try:
                connection, request = requests.popleft()
            except IndexError:
                break
            self._answer(connection, request, "cut_short", "%s, before the window began" % detail)

    def stats(self) -> Dict[str, Any]:
        return {
            "open": self.window is not None,
            "answers": dict(self.answers),
            "lost": self.lost,
            "last_detail": self.last_detail,
        }

    # --- the window ------------------------------------------------------------------------------

    def _open(self, connection: int, req: protocol.AttributeRequest, step: Optional[int]) -> None:
        global _recording
        if req.problem is not None:
            self._answer(connection, req, "failed", req.problem)
            return
        open_ = self.window
        if open_ is not None and open_.connection != connection:
            self.lost += 1  # its connection is gone; the new one asks afresh
            self._stop(open_)
        elif open_ is not None:
            self._answer(connection, req, "failed", "a window is already open (request %d)" % open_.request.id)
            return
        try:
            reason = self.source.unavailable()
        except Exception as exc:  # maybe passing: `failed`, so the daemon may ask again later
            self._answer(connection, req, "failed", "checking for allocation history raised %s" % _exc_text(exc))
            return
        if reason:
            self._answer(connection, req, "unavailable", reason)
            return
        with _lock:
            # An armed session's recording (arming.py) is shared: the window rides on it.
            if _recording is not None and not getattr(_recording, "shares_recording", False):
                busy = True
            else:
                busy = False
                if _recording is None:
                    _recording = self
        if busy:
            self._answer(connection, req, "failed", "another session of this process is recording allocation history")
            return
        try:
            self.source.start(req.max_entries)
        except Exception as exc:
            _safe_stop(self.source)  # in case it switched on before raising
            self._release_recording()
            if isinstance(exc, Unavailable):
                self._answer(connection, req, "unavailable", str(exc))
            else:
                self._answer(connection, req, "failed", "recording allocation history was refused: %s" % _exc_text(exc))
            return
        self.window = Window(req, connection, step)

    def _finish(self, w: Window, step: Optional[int]) -> None:
        before = w.before
        if before is None:  # at_step finishes only windows that took their first snapshot
            raise RuntimeError("the window has no first snapshot")
        try:
            after = self.source.snapshot()
        finally:
            # Off before the diff: recording slows every step, and the diff takes a while.
            self._stop(w)
        seconds = self._monotonic() - w.t_from
        w.stage = "the diff"
        from .snapshot.diff import diff  # imported only when a window ends

        report = diff(before, after, top=w.request.top)
        del before, after
        if not report.stacks_recorded and report.live_bytes[1] > 0:
            # Live blocks but not one with a stack: the history did not record (someone switched
            # it off meanwhile, or this build ignores it). Saying "no sites" would mislead.
            raise RuntimeError("no live block in the second snapshot carries a stack: allocation history was not recorded")
        msg = protocol.attribution(
            w.request.id,
            self._clock(),
            max(0, int(report.total_growth_bytes)),
            [site.as_json() for site in report.sites],
            step_from=w.step_from,
            step_to=step if w.step_from is not None else None,
            seconds=round(seconds, 3),
        )
        fit_line(msg)
        if self.transport.send_answer(msg, w.connection):
            self._count("sites")
            self.last_detail = None
        else:
            self.lost += 1

    def _abort(self, w: Optional[Window], exc: BaseException) -> None:
        if w is None:
            return
        self._stop(w)
        log.debug("gpumon: attribution window %d failed in %s: %r", w.request.id, w.stage, exc)
        self._answer(w.connection, w.request, "failed", "%s raised %s" % (w.stage, _exc_text(exc)), step_from=w.step_from)

    def _stop(self, w: Window) -> None:
        """Ends `w`: recording off (once per window, whatever path gets here first)."""
        if self.window is w:
            self.window = None
        w.before = None
        if w.stopped:
            return
        w.stopped = True
        _safe_stop(self.source)
        self._release_recording()

    def _release_recording(self) -> None:
        global _recording
        with _lock:
            if _recording is self:
                _recording = None

    def _answer(self, connection: int, req: protocol.AttributeRequest, error: str, detail: str, **window: Any) -> None:
        msg = protocol.attribution_error(req.id, self._clock(), error, detail, **window)
        self.last_detail = "%s: %s" % (error, detail)
        if self.transport.send_answer(msg, connection):
            self._count(error)
        else:
            self.lost += 1

    def _count(self, outcome: str) -> None:
        self.answers[outcome] = self.answers.get(outcome, 0) + 1

    def _after_fork(self) -> None:
        # The child has no CUDA context of its own and a connection of its own: the parent's
        # window is not the child's to end.
        global _recording
        self.window = None
        _recording = None


def fit_line(msg: Union[Attribution, Peak]) -> None:
    """Trims `msg["sites"]` (outer frames first, then the smallest sites: snapshot.wire.fit, which
    also holds strings, stacks and the site count to the protocol's limits) so the message is one
    protocol line with _MARGIN to spare."""
    from .snapshot.wire import fit

    sites = msg.get("sites") or []
    bare = protocol.encode(dict(msg, sites=[])) or b""
    budget = protocol.MAX_LINE - len(bare) - _MARGIN
    sites = fit(sites, max(0, budget))
    while True:
        msg["sites"] = sites
        line = protocol.encode(msg)
        if (line is not None and len(line) <= protocol.MAX_LINE - _MARGIN) or not sites:
            return
        sites = sites[:-1]  # fit's estimate was off: the smallest site goes


def _safe_stop(source: SnapshotSource) -> None:
    try:
        source.stop()
    except Exception as exc:  # nothing more can be done; the next start() will say if it is still on
        log.debug("gpumon: stopping allocation history failed: %r", exc)


def _exc_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0]) if text else type(exc).__name__


_live: "weakref.WeakSet[Attributor]" = weakref.WeakSet()


def _reset_in_child() -> None:
    for attributor in list(_live):
        attributor._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
