"""Client: one device's session with the daemon. Builds messages from a StatsSource and hands them
to a Transport. Every public method is safe to call from a training loop: it never raises.
"""

import atexit
import logging
import os
import sys
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from . import _env, protocol, signals
from . import phases as _phase
from .arming import Armer
from .attribution import Attributor
from .messages import Categories, ExplanationJson, Hello
from .snapsource import SnapshotSource, TorchSnapshotSource, default_snapshots
from .stats import StatsSource, TorchStatsSource, default_source
from .transport import Transport

log = logging.getLogger("gpumon_client")

_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()
_DEVICE_EVERY = 1.0  # seconds between reads of device free/total and the allocator cap


class Client:
    """A session with the gpumon daemon for one CUDA device.

    job, rank, world_size: labels for the hello (rank/world_size default to $RANK/$WORLD_SIZE,
    job to $GPUMON_JOB; the daemon names an unlabelled job after the process).
    run_id: the run this rank belongs to, the same on every rank (the daemon sees the ranks of
    one run as one job); defaults to $GPUMON_RUN_ID, $TORCHELASTIC_RUN_ID, $SLURM_JOB_ID(.STEP),
    then MASTER_ADDR:MASTER_PORT (_env.run_id). Cut to 128 bytes.
    source: a StatsSource; defaults to torch.cuda on the current device.
    socket: a socket path; defaults to $GPUMON_SOCKET, /run/gpumon/ingest.sock, then
    $XDG_RUNTIME_DIR/gpumon/ingest.sock.
    stats_keys: memory_stats() keys to send; None sends every key.
    max_buffer: messages kept while the daemon is down or slow (oldest dropped first).
    write_every: seconds samples may wait to be written together (0: each at once). Events, the
    bye and answers go at once and take the waiting samples with them.
    attribution: whether the client offers leak attribution (hello `caps`; the daemon then may
    ask it to record allocation history for a window, see attribution.py). None: when the stats
    come from torch.cuda (TorchStatsSource) or a snapshot source was set with
    testing.use_snapshots(); True: always, with torch.cuda's history; False: never; or a
    SnapshotSource to use. GPUMON_ATTRIBUTION=0 turns it off, =1 on, whatever is passed here.
    """

    # Set by a Reporter or trainer callback that labels steps itself; the optimizer hook then
    # leaves sampling to it.
    explicit_steps = False
    # Set by attach(): told when a window or an arming opens, so that its step hook, which skips
    # the steps its cadence need not look at, calls `at_step` at every step while one is open.
    _wake: Optional[Callable[[], None]] = None

    def __init__(
        self,
        job: Optional[str] = None,
        *,
        source: Optional[StatsSource] = None,
        socket: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        stats_keys: Optional[Iterable[str]] = protocol.KNOWN_STATS_KEYS,
        max_buffer: int = 1024,
        backoff_initial: float = 0.1,
        backoff_max: float = 10.0,
        clock: Callable[[], float] = time.time,
        pid: Optional[int] = None,
        jitter: bool = True,
        attribution: Union[None, bool, SnapshotSource] = None,
        instance: Optional[str] = None,
        write_every: float = 0.5,
        run_id: Optional[str] = None,
    ) -> None:
        self.disabled = _env.disabled()
        # An explicit run_id wins; empty (or blank) counts as unset, like the environment's. A
        # non-str one (a Slurm job id passed as an int) is taken as its str, never raised on.
        # torchrun's default "none" names no run either.
        given = run_id.strip() if isinstance(run_id, str) else ("" if run_id is None else str(run_id))
        self.run_id = _env.clip_run_id(given) if not _env.no_run_id(given) else _env.run_id()
        self.restart = _env.restart_count()
        # Read at attach, as torch reads it at its first allocation: cache_growth's hint names it.
        self.alloc_conf = _env.alloc_conf()
        self.job = job or os.environ.get("GPUMON_JOB") or None
        self.rank = rank if rank is not None else _env.int_env("RANK")
        self.world_size = world_size if world_size is not None else _env.int_env("WORLD_SIZE")
        if source is None:
            source = default_source() or TorchStatsSource(keys=stats_keys)
        self.source = source
        self.stats_keys = tuple(stats_keys) if stats_keys is not None else None
        self._clock = clock
        self._pid = pid
        self._hello_msg: Optional[Hello] = None
        self._monotonic = time.monotonic
        self._device_due = 0.0  # when device free/total and the allocator cap are next read
        self._mem: Optional[Tuple[int, int]] = None
        # The allocator's reserved bytes when `_mem` was read: free memory falls as they grow.
        self._mem_reserved: Optional[int] = None
        self._limit: Optional[int] = None  # the allocator's cap, latest known
        self._limit_sent: Optional[int] = None  # the cap as the daemon last heard it
        paths = (lambda: [socket]) if socket else None
        snapshots = None if self.disabled else _snapshot_source(attribution, source)
        self.transport = Transport(
            self._hello,
            paths=paths,
            max_lines=max_buffer,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            wall=clock,
            jitter=jitter,
            read_every=1 if snapshots is not None else 32,
            instance=instance,
            write_every=write_every,
        )
        # None when the client does not offer attribution: steps then test one attribute.
        self.attributor: Optional[Attributor] = None
        self.armer: Optional[Armer] = None
        if snapshots is not None:
            self.attributor = Attributor(snapshots, self.transport, clock=clock)
            if _env.flag("GPUMON_OOM_HISTORY") is not False:
                self.armer = Armer(snapshots.fresh(), self.transport, self.attributor, clock=clock)
        self.closed = False
        if not self.disabled:
            _clients.add(self)
            _watch_uncaught()
            signals.install(_on_stop_signal)

    # --- messages --------------------------------------------------------------------------------

    def sample(self, step: Optional[int] = None, phase: Optional[str] = None, categories: Optional[Categories] = None) -> None:
        """Reads the allocator and sends one sample. `phase` defaults to the current phase().
        `categories`: the split measured at this step (categories.py); such a sample is rare
        (minutes apart) and goes whatever the daemon's line limit."""
        if self.disabled or self.closed:
            return
        try:
            if categories is None and not self.transport.throttle.allow():
                return  # over the daemon's line limit: it would drop this sample (stats: rate_skipped)
            source = self.source
            stats = source.memory_stats()
            now = self._monotonic()
            reserved = stats.get("reserved_bytes.all.current")
            if now >= self._device_due:
                self._refresh_device(source, now)
                self._mem_reserved = reserved
            keys = self.stats_keys
            mem = self._free_now(reserved)
            limit = None
            if self._limit != self._limit_sent:
                # Sent when it first becomes known or changes; the daemon keeps the last value.
                limit = self._limit_sent = self._limit
            msg = protocol.sample(
                self._clock(),
                {k: stats[k] for k in keys if k in stats} if keys is not None else dict(stats),
                step=step,
                phase=phase or _phase.current(),
                device_free=mem[0],
                device_total=mem[1],
                alloc_limit=limit,
                categories=categories,
            )
            transport = self.transport
            transport.send(msg, True)
            if transport.requests and self.attributor is not None:
                self.attributor.take(step)
                self._woken()
            if transport.arm_requests and self.armer is not None:
                self.armer.take(step)
                self._woken()
        except Exception as exc:
            self.transport._internal_error(exc)

    def stepwise(self) -> bool:
        """Whether an attribution window or an arming is open: `at_step` has work at every step."""
        attributor, armer = self.attributor, self.armer
        return (attributor is not None and attributor.window is not None) or (armer is not None and armer.armed is not None)

    def _woken(self) -> None:
        wake = self._wake
        if wake is not None and self.stepwise():
            wake()

    def at_step(self, step: Optional[int] = None) -> None:
        """A step boundary: moves an open attribution window and an arming on (the time cap, the
        step peak, a deferred start; two attribute tests when neither is open). attach(),
        Reporter.report() and the trainer callbacks call it at every step, before their sample."""
        attributor = self.attributor
        if attributor is not None and attributor.window is not None:
            attributor.at_step(step)
        armer = self.armer
        if armer is not None and armer.armed is not None:
            armer.at_step(step)

    def _free_now(self, reserved: Optional[int]) -> Tuple[Optional[int], Optional[int]]:
        """(free, total) as of this sample: the device's free memory read at the last refresh,
        less what this process's allocator reserved since. Read once a second, free alone lagged
        a fast-growing cache by hundreds of steps, and the daemon's limit (free + reserved) ran
        that far over the device."""
        if self._mem is None:
            return (None, None)
        free, total = self._mem
        base = self._mem_reserved
        if free is None or base is None or reserved is None:
            return (free, total)
        return (max(0, free - (int(reserved) - int(base))), total)

    def _refresh_device(self, source: StatsSource, now: float) -> None:
        # cudaMemGetInfo and the allocator's fraction change slowly; reading them once a second
        # rather than at every sample keeps a sample's cost down to memory_stats().
        self._device_due = now + _DEVICE_EVERY
        self._mem = source.mem_get_info()
        get_limit = getattr(source, "alloc_limit", None)
        limit = get_limit() if get_limit is not None else None
        if limit is None and self._limit is not None and self._mem is not None:
            limit = self._mem[1]  # a cap that was lifted: the whole device again
        self._limit = None if limit is None else int(limit)

    def event(self, kind: str, **fields: Any) -> None:
        """Sends an event; see the protocol for the fields of each kind."""
        if self.disabled or self.closed:
            return
        try:
            self.transport.send(protocol.event(self._clock(), kind, **fields))
        except Exception as exc:
            self.transport._internal_error(exc)

    def mark(self, detail: str, **fields: Any) -> None:
        self.event("mark", detail=detail, **fields)

    def snapshot(self, path: str) -> None:
        """Tells the daemon a memory snapshot was written to `path`."""
        self.event("snapshot", path=os.fspath(path))

    def oom(
        self,
        alloc_bytes: int,
        device_free: Optional[int] = None,
        device: Optional[int] = None,
        limit: Optional[int] = None,
        explanation: Optional[ExplanationJson] = None,
    ) -> None:
        """An `oom` event. `limit`: what the allocator was allowed (its cap, or the device total);
        `explanation`: oomreport.at_oom's, when the observer made one."""
        where = "" if device is None else " on device %d" % device
        detail = "CUDA out of memory%s. Tried to allocate %s" % (where, _human(alloc_bytes))
        if limit is not None:
            detail += " (%s allowed)" % _human(limit)
        self.event(
            "oom",
            alloc_bytes=int(alloc_bytes),
            device_free=device_free,
            alloc_limit=limit,
            detail=detail,
            explanation=explanation,
        )

    def close(self, timeout: float = 0.5) -> None:
        """Sends bye, waiting at most `timeout` seconds for queued lines to go out."""
        if self.closed:
            return
        self.closed = True
        _clients.discard(self)
        if self.disabled:
            return
        if self.attributor is not None:
            # Recording off, and the daemon told the window ended early, before bye or the mark.
            why = "trainer died: %s" % _uncaught if _uncaught is not None else "the trainer stopped reporting"
            self.attributor.cut_short(why)
        if self.armer is not None:
            self.armer.stop(final=True)
        # A client that never sent anything leaves no session behind: no connection just for bye.
        touched = self.transport.connects or self.transport.stats()["buffered"]
        if touched and _uncaught is not None:
            # The process is dying of an uncaught exception: say why, and end without bye, so the
            # daemon records a crash rather than a clean end; or a stop, when a signal (Ctrl-C's
            # KeyboardInterrupt) is what it is dying of.
            stop = signals.received() or ("SIGINT" if _uncaught_type == "KeyboardInterrupt" else None)
            if stop is not None:
                ending: Dict[str, Any] = {"ending": "signal", "signal": stop}
            else:
                ending = {"ending": "exception", "exception": _uncaught_type or "Exception"}
            self.transport.send(protocol.mark_event(self._clock(), "trainer died: %s" % _uncaught, **ending))
            self.transport.close(bye=None, timeout=timeout)
            return
        self.transport.close(bye=protocol.bye(self._clock()) if touched else None, timeout=timeout)

    def _stopping(self, name: str) -> None:
        # From the signal handler: said at once, as the process may die right after.
        if self.disabled or self.closed:
            return
        msg = protocol.event(self._clock(), "mark", detail="trainer got %s" % name, ending="signal", signal=name)
        self.transport.send_now(msg, timeout=_SIGNAL_WAIT)

    def stats(self) -> Dict[str, Any]:
        """The connection's health: connected, buffered, dropped, connects, errors,
        max_lines_per_second (the daemon's limit), rate_skipped (samples held back under it), ...; with
        `attribution` (windows: open, answers by outcome, lost, last_detail) when offered."""
        out = self.transport.stats()
        if self.attributor is not None:
            out["attribution"] = self.attributor.stats()
        if self.armer is not None:
            out["oom_history"] = self.armer.stats()
        return out

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- internals -------------------------------------------------------------------------------

    def _caps(self) -> Optional[List[str]]:
        caps = [protocol.CAP_ATTRIBUTION] if self.attributor is not None else []
        if self.armer is not None:
            caps.append(protocol.CAP_OOM_HISTORY)
        return caps or None

    def _hello(self) -> Hello:
        # Built at the first connection, not at construction: by then the trainer has picked
        # its device (set_device after attach() is common). Resent unchanged on reconnects.
        msg = self._hello_msg
        if msg is None or msg["pid"] != (self._pid or os.getpid()):
            try:
                info = dict(self.source.device_info() or {})
            except Exception as exc:
                log.debug("gpumon: device info unavailable: %r", exc)
                info = {}
            if self._limit is None and info.get("alloc_limit") is not None:
                self._limit = int(info["alloc_limit"])
            msg = self._hello_msg = protocol.hello(
                pid=self._pid or os.getpid(),
                job=self.job,
                rank=self.rank,
                world_size=self.world_size,
                run_id=self.run_id,
                restart=self.restart,
                caps=self._caps(),
                cuda_device=info.get("cuda_device"),
                gpu_uuid=info.get("gpu_uuid"),
                torch=info.get("torch"),
                allocator=info.get("allocator"),
                expandable_segments=info.get("expandable_segments"),
                alloc_conf=self.alloc_conf,
            )
        # A reconnect's hello carries the cap as it is now, not as it was at the first hello.
        if self._limit is not None:
            msg["alloc_limit"] = self._limit
        self._limit_sent = self._limit
        return msg


def _snapshot_source(option: Union[None, bool, SnapshotSource], stats: StatsSource) -> Optional[SnapshotSource]:
    """Where attribution windows get their snapshots from; None: no attribution offered."""
    forced = _env.flag("GPUMON_ATTRIBUTION")
    if forced is False or (forced is None and option is False):
        return None
    if option is not None and not isinstance(option, bool):
        return option
    injected = default_snapshots()
    if injected is not None:
        return injected
    if isinstance(stats, TorchStatsSource):
        return TorchSnapshotSource(lambda: stats.device)
    if option is True or forced is True:
        return TorchSnapshotSource()
    return None


def _human(n: int) -> str:
    # The allocator's own wording ("2.00 GiB"), so the detail reads like torch's OOM message.
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return "%d bytes" % n if unit == "bytes" else "%.2f %s" % (value, unit)
        value /= 1024
    return "%.2f GiB" % value


_uncaught: Optional[str] = None  # the exception the process is dying of, once sys.excepthook saw it
_uncaught_type: Optional[str] = None  # its type's name, at most 128 bytes (the protocol's label)
_prev_excepthook: Optional[Callable[..., Any]] = None
_SIGNAL_WAIT = 0.25  # seconds a signal handler waits for its mark to be written


def _excepthook(exc_type: Any, exc: Any, tb: Any) -> None:
    global _uncaught, _uncaught_type
    if _uncaught is None:
        name = getattr(exc_type, "__name__", "exception")
        _uncaught_type = protocol.clip(str(name), 128)
        _uncaught = ("%s: %s" % (name, exc))[:300]
    (_prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _on_stop_signal(name: str) -> None:
    for client in list(_clients):
        client._stopping(name)


def _watch_uncaught() -> None:
    # Chained, so the trainer's own excepthook (and the traceback) still run.
    global _prev_excepthook
    if sys.excepthook is not _excepthook:
        _prev_excepthook = sys.excepthook
        sys.excepthook = _excepthook


def _close_all() -> None:
    # A session that ends without bye reads as a crashed trainer, so clients the trainer forgot
    # to close say bye at exit (bounded by each close's timeout).
    for client in list(_clients):
        client.close(timeout=0.5)


atexit.register(_close_all)


def _broadcast_phase(name: str) -> None:
    for client in list(_clients):
        client.event("phase", phase=name)


# phases tells its listeners of a change; it imports nothing of the client.
_phase.listen(_broadcast_phase)
