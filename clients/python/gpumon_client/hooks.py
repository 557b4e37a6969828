"""attach(): zero-touch instrumentation of a PyTorch trainer through global torch hooks.

(The module is not named attach.py because the package exports the attach function under that name.)
"""

import atexit
import importlib
import logging
import sys
import threading
from time import perf_counter
from typing import Any, Iterable, Optional, Set, Union

from . import _env, dynamo, oomreport, protocol
from .cadence import Cadence
from .client import Client
from .snapsource import SnapshotSource
from .stats import StatsSource, TorchStatsSource, default_source

log = logging.getLogger("gpumon_client")

_lock = threading.Lock()
_state: Optional["Attachment"] = None
_oom_observer_installed = False
_atexit_registered = False
# Steps between looks at a client whose steps a Reporter or trainer callback labels.
_RECHECK = 1 << 20


class Attachment:
    """What attach() returns. `client` is None when attaching was a no-op (disabled, no torch/CUDA)."""

    def __init__(self, client: Optional[Client] = None, cadence: Optional[Cadence] = None, reason: str = "") -> None:
        self.client = client
        self.cadence = cadence or Cadence()
        # Why attaching was a no-op ("" when active or disabled on purpose), for the launcher.
        self.reason = reason
        self.step = 0
        self._stepped: Set[int] = set()
        # The fast path (_optimizer_hook): while one optimizer steps, steps before `_check_at`
        # only count. `_only` is that optimizer's id (0 while none or several step).
        self._only = 0
        self._check_at = 0
        self._checked = 0  # the step of the last cadence decision
        self._hook_handle: Any = None
        self._torch: Any = None
        self._oom_pending = False
        # Whether the OOM observer reads the allocator (a snapshot) to explain the OOM.
        self.explain_ooms = True
        if client is not None:
            client._wake = self._wake

    @property
    def active(self) -> bool:
        return self.client is not None and _state is self

    def _wake(self) -> None:
        # A window or an arming opened: it moves on at every step, so every step takes the path.
        self._check_at = 0

    def on_optimizer_step(self, optimizer: Any) -> None:
        # One training step can step several optimizers (GANs, per-module optimizers). A step
        # ends when an optimizer that already stepped steps again, so each training step yields
        # one sample, taken after its first optimizer.step().
        key = id(optimizer)
        stepped = self._stepped
        if key in stepped:
            if len(stepped) > 1:
                stepped.clear()
                stepped.add(key)
        elif stepped:
            stepped.add(key)
            self._only = 0
            return
        else:
            stepped.add(key)
        self._only = key if len(stepped) == 1 else 0
        step = self.step = self.step + 1
        client = self.client
        if client is None or client.explicit_steps:
            # A Reporter or trainer callback labels steps itself; it is the better source.
            self._check_at = step + _RECHECK
            return
        if self._oom_pending:
            self._oom_pending = False
            _install_oom_observer(self._torch, now=True)
        client.at_step(step)  # before the sample: a request it brings starts after it
        cadence = self.cadence
        steps, self._checked = step - self._checked, step
        if cadence.due(steps):
            t0 = perf_counter()
            client.sample(step=step)
            cadence.spent(perf_counter() - t0)
        if self._oom_pending or client.stepwise():
            self._check_at = step + 1
        else:
            self._check_at = step + 1 + cadence.wait

    def detach(self, timeout: float = 0.5) -> None:
        """Removes the hook and ends the session with bye."""
        global _state
        with _lock:
            if _state is self:
                _state = None
        handle, self._hook_handle = self._hook_handle, None
        if handle is not None:
            try:
                handle.remove()
            except Exception:
                pass
        if self.client is not None:
            self.client.close(timeout=timeout)


def attach(
    job: Optional[str] = None,
    *,
    source: Optional[StatsSource] = None,
    socket: Optional[str] = None,
    device: Optional[int] = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    every: int = 1,
    max_rate: Optional[float] = 10.0,
    budget: Optional[float] = 0.005,
    oom: bool = True,
    stats_keys: Optional[Iterable[str]] = protocol.KNOWN_STATS_KEYS,
    max_buffer: int = 1024,
    attribution: Union[None, bool, SnapshotSource] = None,
) -> Attachment:
    """Instruments the process: samples at optimizer steps and an `oom` event on CUDA OOM.

    Samples follow a cadence (cadence.py): at most `max_rate` per second, at least `every` steps
    apart, within `budget` of the step time. Safe to call more than once (later calls return the
    first attachment) and never raises. Returns a no-op Attachment (its `reason` says why) when
    GPUMON_DISABLE=1, or torch or CUDA is unavailable.

    attribution: whether the daemon may ask this trainer where a leak's memory is allocated
    (Client's `attribution`; by default offered with torch.cuda's allocation history).
    """
    global _state, _atexit_registered
    if _env.disabled():
        return Attachment()
    with _lock:
        if _state is not None:
            return _state
        try:
            cadence = Cadence(every=every, max_rate=max_rate, budget=budget)
            torch = _import_torch()
            if torch is None:
                return _noop("torch is not importable")
            if source is None:
                source = default_source()
            if source is None:
                if not TorchStatsSource.available():
                    return _noop("CUDA is not available to torch %s" % _torch_version(torch))
                source = TorchStatsSource(device, keys=stats_keys)
            register = _step_hook_registrar(torch)
            if register is None:
                return _noop(
                    "torch %s has no optimizer step hooks (torch.optim.optimizer."
                    "register_optimizer_step_post_hook, torch >= 2.0); use Reporter or a trainer callback"
                    % _torch_version(torch),
                )
            client = Client(
                job,
                source=source,
                socket=socket,
                rank=rank,
                world_size=world_size,
                stats_keys=stats_keys,
                max_buffer=max_buffer,
                attribution=attribution,
            )
            state = Attachment(client, cadence)
            state._torch = torch
            state._hook_handle = register(_optimizer_hook)
            dynamo.keep_step_hooks(torch)
            if oom:
                state._oom_pending = not _install_oom_observer(torch)
            _state = state
            if not _atexit_registered:
                atexit.register(_at_exit)
                _atexit_registered = True
            return state
        except ValueError:
            raise  # a bad argument (every, max_rate, budget) is the caller's to fix, at attach time
        except Exception as exc:
            return _noop("attach failed: %r" % (exc,))


# Reasons already said: a script that calls attach() again is not told twice.
_said: Set[str] = set()


def _noop(reason: str) -> Attachment:
    """A no-op Attachment, said once per reason at WARNING, which Python shows on stderr even
    where logging was never configured: a run that reports nothing should not look like one
    that does."""
    if reason not in _said:
        _said.add(reason)
        log.warning("gpumon: %s; nothing will be reported to gpumon (training continues)", reason)
    return Attachment(reason=reason)


def detach(timeout: float = 0.5) -> None:
    """Undoes attach(), sending bye."""
    state = _state
    if state is not None:
        state.detach(timeout=timeout)


def current() -> Optional[Attachment]:
    return _state


def _import_torch() -> Any:
    try:
        return sys.modules.get("torch") or importlib.import_module("torch")
    except Exception:
        return None


def _torch_version(torch: Any) -> str:
    return str(getattr(torch, "__version__", "?"))


def _step_hook_registrar(torch: Any) -> Any:
    # Imported as a module: `torch.optim.optimizer` is not an attribute of `torch.optim` on
    # current torch (2.11 and later), only a submodule that has to be imported.
    try:
        optimizer_mod = importlib.import_module("torch.optim.optimizer")
    except Exception:
        return None
    return getattr(optimizer_mod, "register_optimizer_step_post_hook", None)


def _optimizer_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    # Every training step pays for this function: steps that only count touch one global, one
    # object and three of its attributes (in the training loop, where the step has evicted the
    # caches, each touch costs more than its instructions).
    state = _state
    if state is None:
        return
    if id(optimizer) == state._only:
        step = state.step + 1
        if step < state._check_at:
            state.step = step
            return
    try:
        state.on_optimizer_step(optimizer)
    except Exception as exc:
        if state.client is not None:
            state.client.transport._internal_error(exc)


def _oom_observer(device: int, alloc: int, limit: int, device_free: int) -> None:
    # Called by the caching allocator when an allocation fails, before torch raises
    # OutOfMemoryError, as observer(device, alloc_size, limit, device_free): `limit` is the
    # allocator's allowed maximum when set_per_process_memory_fraction was used, else the device
    # total (c10/cuda/CUDACachingAllocator.cpp).
    state = _state
    if state is None or state.client is None:
        return
    explanation = None
    try:
        if state.explain_ooms:
            explanation = oomreport.at_oom(int(device), int(alloc), int(limit))
    except Exception:
        pass  # the event goes without it
    try:
        state.client.oom(
            alloc, device_free=int(device_free), device=int(device), limit=int(limit), explanation=explanation
        )
    except Exception:
        pass


def _install_oom_observer(torch: Any, now: bool = False) -> bool:
    """Attaches the allocator's OOM observer once per process. True when installed or queued.

    The allocator registers the observer only on devices it has initialised, so before CUDA is
    initialised the call is queued with torch.cuda._lazy_call to run right after lazy init;
    without that private helper it waits for the first optimizer step (now=True).
    """
    if _oom_observer_installed:
        return True
    try:
        attach_fn = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach_fn is None:
            return True  # nothing to install on this torch build; do not retry every step

        def install() -> None:
            global _oom_observer_installed
            try:
                if not _oom_observer_installed:
                    attach_fn(_oom_observer)
                    _oom_observer_installed = True
            except Exception as exc:  # must not break the trainer's CUDA init
                log.debug("gpumon: OOM observer not installed: %r", exc)

        cuda = torch.cuda
        if now or cuda.is_initialized():
            install()
            return True
        lazy_call = getattr(cuda, "_lazy_call", None)
        if lazy_call is None:
            return False
        lazy_call(install)
        return True
    except Exception as exc:
        log.debug("gpumon: OOM observer not installed: %r", exc)
        return True


def _at_exit() -> None:
    state = _state
    if state is not None:
        state.detach()
