"""attach(): zero-touch instrumentation of a PyTorch trainer through global torch hooks.

(The module is not named attach.py because the package exports the attach function under that name.)
"""

import atexit
import importlib
import logging
import sys
import threading
import weakref
from time import perf_counter
from typing import Any, Callable, Iterable, Optional, Set, Tuple, Union

from . import _env, dynamo, oomreport, protocol
from . import categories as _categories
from .cadence import Cadence
from .client import Client
from .snapsource import SnapshotSource
from .stats import StatsSource, TorchStatsSource, default_source

log = logging.getLogger("gpumon_client")

_lock = threading.Lock()
_state: Optional["Attachment"] = None
_oom_observer_installed = False
_atexit_registered = False
# The most steps the fast path counts before the whole path runs again: CPython caches the ints
# up to 256, so counting within them allocates nothing.
_MAX_LEFT = 250


class _Nothing:
    pass


# The fast path's reference while no single optimizer steps: it never returns an optimizer.
_NOTHING = _Nothing()
_NO_OPTIMIZER: "weakref.ReferenceType[Any]" = weakref.ref(_NOTHING)


def _countdown(att: "Attachment") -> Tuple[Callable[[Any, Any, Any], None], Callable[[], int], Callable[[], int], Callable[[Any, int], None]]:
    """The step hook torch calls, and the three views of its countdown the attachment uses.

    Every training step pays for `hook`. While one optimizer steps (held by a weak reference, so
    that a dropped optimizer and its state are freed), the steps its cadence need not look at
    only count down `left`: a closure's cells, small ints (CPython caches them, so counting
    allocates nothing) and one weak reference call. In the training loop, where the step has
    evicted the caches, a global, an object's attributes or a new int each cost more than their
    instructions: this path measured about 0.3 us over an empty hook there (bench_client.py's
    0.22 ms step), the same path through a global and an object's attributes about 0.9 us.
    """
    left = 0  # calls the hook may still only count, plus one
    left0 = 0  # `left` when the countdown began
    ref: "weakref.ReferenceType[Any]" = _NO_OPTIMIZER
    whole = att.on_optimizer_step

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal left
        left -= 1
        if left > 0 and ref() is optimizer:
            return
        left += 1  # not a counted step
        try:
            whole(optimizer)
        except Exception as exc:
            if att.client is not None:
                att.client.transport._internal_error(exc)

    def pending() -> int:
        return left0 - left

    def fold() -> int:
        nonlocal left, left0
        counted = left0 - left
        left0 = left = 0
        return counted

    def count_down(optimizer: Any, skip: int) -> None:
        # The next `skip` calls by `optimizer` only count (None: several optimizers step).
        nonlocal left, left0, ref
        left0 = left = 0
        if optimizer is None:
            ref = _NO_OPTIMIZER
            return
        try:
            if ref() is not optimizer:
                ref = weakref.ref(optimizer)
        except TypeError:  # an optimizer without weak references: every step takes the path
            ref = _NO_OPTIMIZER
            return
        left0 = left = (skip if skip < _MAX_LEFT else _MAX_LEFT) + 1

    return hook, pending, fold, count_down


class Attachment:
    """What attach() returns. `client` is None when attaching was a no-op (disabled, no torch/CUDA)."""

    def __init__(self, client: Optional[Client] = None, cadence: Optional[Cadence] = None, reason: str = "") -> None:
        self.client = client
        self.cadence = cadence or Cadence()
        # Why attaching was a no-op ("" when active or disabled on purpose), for the launcher.
        self.reason = reason
        self._step = 0  # steps counted before the hook's countdown (see `step`)
        self._stepped: Set[int] = set()
        self._checked = 0  # the step of the last cadence decision
        self.hook, self._pending, self._fold_pending, self._count_down = _countdown(self)
        self._hook_handle: Any = None
        self._torch: Any = None
        self._oom_pending = False
        # The memory split (categories.py), measured on one step now and then; None: not measured.
        self.categories: Optional[_categories.CategoryProbe] = None
        # Whether the OOM observer reads the allocator (a snapshot) to explain the OOM.
        self.explain_ooms = True
        if client is not None:
            client._wake = self._wake

    @property
    def active(self) -> bool:
        return self.client is not None and _state is self

    @property
    def step(self) -> int:
        """Training steps seen: one per step of the first optimizer of each step."""
        return self._step + self._pending()

    def _wake(self) -> None:
        # A window or an arming opened: it moves on at every step, so every step takes the path.
        self._step += self._fold_pending()
        # An arming means an OOM is coming: the split, measured now, says what would shrink it.
        cats, client = self.categories, self.client
        armer = client.armer if client is not None else None
        if cats is not None and armer is not None and armer.armed is not None:
            cats.ask()

    def on_optimizer_step(self, optimizer: Any) -> None:
        """The whole step path: what `hook` runs at the steps it does not only count."""
        # One training step can step several optimizers (GANs, per-module optimizers). A step
        # ends when an optimizer that already stepped steps again, so each training step yields
        # one sample, taken after its first optimizer.step().
        step = self._step + self._fold_pending()
        key = id(optimizer)
        stepped = self._stepped
        if key in stepped:
            if len(stepped) > 1:
                stepped.clear()
                stepped.add(key)
        elif stepped:
            stepped.add(key)
            self._step = step
            cats = self.categories
            if cats is not None:
                cats.others.add(optimizer)  # its state counts in the split
            return
        else:
            stepped.add(key)
        step = self._step = step + 1
        single = optimizer if len(stepped) == 1 else None
        client = self.client
        if client is None or client.explicit_steps:
            # A Reporter or trainer callback labels steps itself; it is the better source.
            self._count_down(single, _MAX_LEFT)
            return
        if self._oom_pending:
            self._oom_pending = False
            _install_oom_observer(self._torch, now=True)
        client.at_step(step)  # before the sample: a request it brings starts after it
        cadence = self.cadence
        steps, self._checked = step - self._checked, step
        cats = self.categories
        split = None if cats is None else cats.at_step(step, optimizer)
        if cadence.due(steps) or split is not None:
            # The measured step is sampled whatever the cadence; only the sample is charged to it.
            t0 = perf_counter()
            client.sample(step=step, categories=split)
            cadence.spent(perf_counter() - t0)
        wait = 0 if self._oom_pending or client.stepwise() else cadence.wait
        if cats is not None and wait:
            limit = cats.skip_limit(step)
            wait = limit if limit < wait else wait
        self._count_down(single, wait)

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
        cats = self.categories
        if cats is not None:
            cats.close()
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
    write_every: float = 0.5,
    run_id: Optional[str] = None,
    categories: bool = True,
) -> Attachment:
    """Instruments the process: samples at optimizer steps and an `oom` event on CUDA OOM.

    Samples follow a cadence (cadence.py): at most `max_rate` per second, at least `every` steps
    apart, within `budget` of the step time. Safe to call more than once (later calls return the
    first attachment) and never raises. Returns a no-op Attachment (its `reason` says why) when
    GPUMON_DISABLE=1, or torch or CUDA is unavailable.

    attribution: whether the daemon may ask this trainer where a leak's memory is allocated
    (Client's `attribution`; by default offered with torch.cuda's allocation history).
    write_every: seconds samples may wait to be written together (Client's `write_every`).
    run_id: the run this rank belongs to (Client's `run_id`; by default from the launcher's
    environment: torchrun, Slurm, MASTER_ADDR:MASTER_PORT).
    categories: whether to measure where the memory goes (parameters, gradients, optimizer
    state, buffers, activations) on one step now and then (categories.py);
    GPUMON_CATEGORIES=0 turns it off, =1 on, whatever is passed here.
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
                write_every=write_every,
                run_id=run_id,
            )
            state = Attachment(client, cadence)
            state._torch = torch
            forced = _env.flag("GPUMON_CATEGORIES")
            if forced is True or (forced is None and categories):
                chosen = source
                state.categories = _categories.CategoryProbe(lambda: _categories.start(torch, chosen))
            state._hook_handle = register(state.hook)
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
    """The current attachment's step hook (attach() registers the attachment's own `hook`)."""
    state = _state
    if state is not None:
        state.hook(optimizer, args, kwargs)


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
                    # The observer runs at an OOM: what it explains with is imported now, not then.
                    oomreport.prepare()
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
