"""Where the memory goes: parameters, gradients, optimizer state, buffers and activations,
measured on one training step now and then (design/categories.md).

attach() alone finds all of it, with no model argument. At the end of the step before the one to
measure (its optimizer hook), `CategoryProbe` arms a `Measurement`: torch's global module hooks
(`register_module_forward_pre_hook`, `register_module_forward_hook`). During the measured step
they note every module that runs, the batch size (the first dimension of the first tensor given
to the outermost module), and, from the first outermost module run with grad enabled, they push a
pair of `saved_tensors_hooks` that see each tensor autograd saves for backward. At that step's
optimizer hook the measurement reads the parameters and buffers of those modules, their `.grad`,
and the tensors in each stepped optimizer's `state`, removes every hook, and the step's sample
carries the split. Every other step pays nothing: no hook is registered outside the measured step.

What counts: only tensors on the session's device (`StatsSource.tensor_device()`), each storage
once (tied weights, views, flat parameters and bucket views count their storage once; a
parameter's storage is not counted again as a buffer, an activation or a gradient).
`activations_bytes` is the most that was saved and not yet freed at once (a tensor saved by
several ops, or by an op of the loss outside the model, counts once; parameters and buffers never
count), so with gradient accumulation it is one micro-batch's, and activation checkpointing
shrinks it. Where the sums are known to lie (sharded parameters, DTensor, Megatron's
`main_grad`, gradients kept outside `.grad`), the split says so in `partial`.

Never raises into the trainer: a failure disarms the measurement, removes its hooks and is logged
at debug; three in a row stop measuring for the session. A model compiled with torch.compile is
not measured: global module hooks would make dynamo recompile it.
"""

import importlib
import logging
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from . import protocol
from .messages import Categories

log = logging.getLogger("gpumon_client")

FIRST_STEP = 3  # the first step measured (the first two warm up: lazy state, allocator caches)
INTERVAL = 300.0  # seconds: at most one measured step in this long
_MAX_FAILURES = 3  # failed measurements in a row that stop measuring for the session
_FAR = 1 << 30  # steps the hook may skip when no measurement is due by step count
_MAX_ABOVE = 16  # the trainer's saved-tensor hooks we look under for ours

# Why a split is partial: each reason is "code: explanation" (the code stays; the text may change).
# The codes are a contract with the daemon: tests/fixtures/partial_split_codes.json lists them.
PARTIAL_SHARDED = "sharded_parameters"  # parameters of size 0 here, or FSDP1 flat parameters: a shard each
PARTIAL_ZERO3 = "zero3_partitions"  # DeepSpeed ZeRO-3: each parameter's ds_tensor partition counted
PARTIAL_DTENSOR = "dtensor_local"  # DTensor (FSDP2, tensor parallel): local shard sizes counted
PARTIAL_MAIN_GRAD = "main_grad"  # Megatron: gradients in main_grad (a view of one buffer)
PARTIAL_GRADS_ELSEWHERE = "gradients_elsewhere"  # trainable parameters, none with a gradient (ZeRO-2)
PARTIAL_ACTIVATIONS = "activations_unmeasured"  # the trainer's own saved_tensors_hooks were in the way
PARTIAL_NO_GRAD_ROOT = "no_grad_forward"  # no module ran with grad enabled: nothing saved for backward

Key = Tuple[int, int]  # a storage: (data_ptr, nbytes)


class CategoryProbe:
    """When to measure, and the measurement under way; one per attachment.

    start: arms a new measurement (returns None when it cannot); `clock`: monotonic seconds.
    The first measured step is the first from `first_step` on; then at most one every `interval`
    seconds (a measurement armed, whether or not it succeeded).
    """

    def __init__(
        self,
        start: Callable[[], Optional["Measurement"]],
        clock: Callable[[], float] = time.monotonic,
        first_step: int = FIRST_STEP,
        interval: float = INTERVAL,
    ) -> None:
        self._start = start
        self._clock = clock
        self.first_step = int(first_step)
        self.interval = float(interval)
        self.measuring: Optional[Measurement] = None
        self.off: Optional[str] = None  # why measuring stopped for the session
        self.last: Optional[Categories] = None  # the latest split sent
        self.measured = 0
        self.failures = 0  # failed measurements in a row
        self.failed = 0
        self.cost = 0.0  # seconds the latest measurement's reading took at its optimizer hook
        self._armed_at: Optional[float] = None
        self._asked = False
        # Optimizers stepped after the first of a training step (GANs, per-module optimizers): the
        # measured step's hook sees only the first, yet all their states count.
        self.others: "weakref.WeakSet[Any]" = weakref.WeakSet()
        # Measurements whose saved-tensor hooks could not be popped (the trainer pushed its own on
        # top and kept them past the step): popped as soon as they are on top again.
        self._stale: List[Measurement] = []

    def ask(self) -> None:
        """Measures the next step whatever the interval (an arming or near_limit asks)."""
        self._asked = True

    def skip_limit(self, step: int) -> int:
        """How many of the next steps the step hook may only count: the whole path must run at the
        step that arms a measurement (the one before the step measured) and at the measured step."""
        if self.measuring is not None or self._stale or self._asked:
            return 0
        if self.off is not None or self._armed_at is not None:
            return _FAR  # by time: the cadence's own decisions come often enough to find it due
        return max(0, self.first_step - 2 - step)

    def at_step(self, step: int, optimizer: Any) -> Optional[Categories]:
        """At the first optimizer hook of each training step that takes the whole path: finishes
        the measurement armed at the step before (its split, or None), or arms one for the next
        step when due. Never raises."""
        try:
            if self._stale:
                self._stale = [m for m in self._stale if not m.unstale()]
            m = self.measuring
            if m is not None:
                self.measuring = None
                return self._finish(m, step, optimizer)
            if self.off is None and step + 1 >= self.first_step:
                now = self._clock()
                if self._asked or self._armed_at is None or now - self._armed_at >= self.interval:
                    self._asked = False
                    self._armed_at = now
                    m = self._start()
                    if m is not None and m.off is not None:
                        self.off = m.off
                        log.debug("gpumon: memory split off for this session: %s", m.off)
                    else:
                        self.measuring = m
        except Exception as exc:
            self._failure("gpumon: memory split at step %d failed: %r" % (step, exc))
        return None

    def _finish(self, m: "Measurement", step: int, optimizer: Any) -> Optional[Categories]:
        t0 = time.perf_counter()
        optimizers = [optimizer]
        optimizers.extend(o for o in list(self.others) if o is not optimizer)
        out = m.finish(step, optimizers)
        self.cost = time.perf_counter() - t0
        if m.stale:
            self._stale.append(m)
        if m.off is not None:
            self.off = m.off
            log.debug("gpumon: memory split off for this session: %s", m.off)
            return None
        if out is None:
            self._failure("gpumon: memory split at step %d not measured: %s" % (step, m.error or "nothing measured"))
            return None
        self.failures = 0
        self.measured += 1
        self.last = out
        return out

    def _failure(self, text: str) -> None:
        m, self.measuring = self.measuring, None
        if m is not None:
            m.close()
            if m.stale:
                self._stale.append(m)
        self.failures += 1
        self.failed += 1
        log.debug(text)
        if self.failures >= _MAX_FAILURES and self.off is None:
            self.off = "%d measurements in a row failed" % self.failures

    def close(self) -> None:
        """Disarms (detach()): no hook of a measurement stays registered."""
        m, self.measuring = self.measuring, None
        if m is not None:
            m.close()
        self.off = self.off or "closed"

    def stats(self) -> Dict[str, Any]:
        return {"measured": self.measured, "failed": self.failed, "off": self.off, "cost_s": self.cost}


# --- the measurement on real torch ------------------------------------------------------------


def tensor_device_of(source: Any) -> str:
    """The device whose tensors count: the source's `tensor_device()`, else its CUDA device."""
    from .stats import cuda_device_name

    get = getattr(source, "tensor_device", None)
    if callable(get):
        return str(get())
    try:
        return cuda_device_name(source.device_info())
    except Exception:
        return "cuda"


def compiled(torch: Any) -> bool:
    """Whether torch.compile has compiled anything in this process (dynamo's counters). Global
    module hooks change what dynamo traces and guards on: a measured step would recompile."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return False
    try:
        return bool(counters["frames"]["ok"] or counters["stats"]["unique_graphs"])
    except Exception:
        return False


def start(torch: Any, source: Any) -> Optional["Measurement"]:
    """Arms a measurement of the next step on real torch, or None (off for good: see `Measurement.off`)."""
    m = Measurement(torch, torch.device(tensor_device_of(source)))
    m.arm()
    return m


def _top_hooks_fn(torch: Any) -> Any:
    """torch's reader of the saved-tensor hooks stack (torch >= 2.8), or None. Its own function,
    so tests can stand in for an older torch."""
    return getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


class _Held:
    """What the pack hook hands autograd for one saved tensor: what the trainer's own hooks
    packed (or the tensor, detached), and the storages it keeps live in the count. autograd drops
    it when it frees the saved tensor (after backward), which releases them."""

    __slots__ = ("obj", "keys", "owner")

    def __init__(self, obj: Any) -> None:
        self.obj = obj
        self.keys: Optional[List[Tuple[Key, int]]] = None
        self.owner: Optional[Measurement] = None

    def __del__(self) -> None:
        owner, keys = self.owner, self.keys
        if owner is not None and keys is not None:
            owner._release(keys)


class Measurement:
    """One measured step: hooks armed at the end of the step before, read and removed at its own
    optimizer hook (`finish`). `device`: a torch.device; only its tensors count."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self._any_index = getattr(device, "index", None) is None
        self._tensor_types = (torch.Tensor, torch.nn.Parameter)
        self._parameter = torch.nn.Parameter
        self._float32 = torch.float32
        self._handles: List[Any] = []
        self.roots: List[Any] = []  # the outermost modules called, in order
        self._root_ids: Set[int] = set()
        self.modules: Dict[int, Any] = {}
        self.depth = 0
        self.batch_size: Optional[int] = None
        self._batch_from: Optional[int] = None  # the root call whose kwargs may hold the batch
        self._grad_root = False  # a root ran with grad enabled
        self.exclude: Set[Key] = set()  # storages of parameters and buffers: never activations
        self.live: Dict[Key, int] = {}  # storages saved for backward and not yet freed: refs
        self.live_bytes = 0
        self.peak = 0
        self.partial: Dict[str, str] = {}
        self.counting = False  # the pack hook counts
        self.mode: Optional[str] = None  # "span": ours pushed until finish; "scoped": within each root; "done"
        # The training thread (the one that armed): module calls in other threads (DataParallel's
        # replicas, a background evaluator) are not this step's, and saved-tensor hooks are
        # per thread anyway.
        self._thread = threading.get_ident()
        self._packs: List[Any] = []  # our pack hooks on the saved-tensor hooks stack, oldest first
        self._scoped = 0  # scoped pushes outstanding
        self.stale = False
        self._probing = False  # _is_top() on older torch: is our pack hook the one called?
        self._probe_hit = False
        self.error: Optional[str] = None  # why this measurement failed
        self.off: Optional[str] = None  # why no measurement should be tried again

    # --- arming and disarming -----------------------------------------------------------------

    def arm(self) -> None:
        if compiled(self.torch):
            self.off = "torch.compile is in use: global module hooks would make dynamo recompile"
            return
        hooks = importlib.import_module("torch.nn.modules.module")
        self._handles.append(hooks.register_module_forward_pre_hook(self._pre))
        register = hooks.register_module_forward_hook
        try:  # keyword arguments (HF models: model(**batch)) and a forward that raises: torch >= 2.x
            self._handles.append(register(self._post, with_kwargs=True, always_call=True))
        except TypeError:
            try:
                self._handles.append(register(self._post, always_call=True))
            except TypeError:
                self._handles.append(register(self._post))

    def _remove_module_hooks(self) -> None:
        handles, self._handles = self._handles, []
        hooks = sys.modules.get("torch.nn.modules.module")
        for handle in handles:
            try:
                handle.remove()
            except Exception:
                pass
            # torch's handle leaves the with_kwargs mark behind (register_module_forward_hook
            # keeps it outside the handle's dicts): a stale one reads as a global hook to
            # torch.compile's OptimizedModule, which then warns at every call.
            marks = getattr(hooks, "_global_forward_hooks_with_kwargs", None)
            if isinstance(marks, dict):
                marks.pop(getattr(handle, "id", None), None)

    def close(self) -> None:
        """Removes every hook this measurement holds, now (a failure, detach())."""
        self.counting = False
        self._remove_module_hooks()
        self._end_saved()
        self._drop_refs()

    def _drop_refs(self) -> None:
        # The step's modules: kept only while measuring (saved tensors still held keep `owner`).
        self.roots = []
        self.modules = {}

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = repr(exc)
        self.counting = False

    # --- the module hooks ---------------------------------------------------------------------

    def _pre(self, module: Any, args: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        try:
            if self.error is not None or self.off is not None:
                return
            self.modules[id(module)] = module
            if self.depth == 0:
                self._root(module, args)
            elif getattr(module, "_orig_mod", None) is not None:
                self._compiled_module()
        except Exception as exc:
            self._fail(exc)
        finally:
            self.depth += 1

    def _post(self, module: Any, args: Any, *rest: Any) -> None:
        # (module, args, kwargs, output) as registered with_kwargs; (module, args, output) without,
        # and also with it when torch runs always_call hooks after a forward that raised (torch
        # 2.15 passes no kwargs there). Non-reentrant checkpointing raises on purpose in its
        # recomputation, so that path is common.
        if threading.get_ident() == self._thread:
            self._after(module, rest[0] if len(rest) == 2 else None)

    def _after(self, module: Any, kwargs: Any) -> None:
        self.depth -= 1
        if self.depth > 0:
            return
        self.depth = 0
        try:
            if self._batch_from == id(module):
                self._batch_from = None
                if kwargs:
                    self.batch_size = _batch_of(self._tensor_types, kwargs)
            if self._scoped:
                self._pop_scoped()
        except Exception as exc:
            self._fail(exc)

    def _compiled_module(self) -> None:
        self.off = "torch.compile is in use: global module hooks would make dynamo recompile"
        self.counting = False
        self._remove_module_hooks()

    def _root(self, module: Any, args: Any) -> None:
        if getattr(module, "_orig_mod", None) is not None or getattr(module, "_compiled_call_impl", None) is not None:
            self._compiled_module()  # before its compiled forward checks its guards
            return
        if id(module) not in self._root_ids:
            self._root_ids.add(id(module))
            self.roots.append(module)
            for sub in module.modules():
                for p in sub._parameters.values():
                    self._exclude(p)
                for b in sub._buffers.values():
                    self._exclude(b)
        if not self.torch.is_grad_enabled():
            return  # a teacher or eval forward: its parameters count, not its batch
        if not self._grad_root:
            self._grad_root = True
            batch = _batch_of(self._tensor_types, args)
            if batch is not None:
                self.batch_size = batch
            else:
                self._batch_from = id(module)
        if self.mode is None:
            self._start_saved()
        elif self.mode == "scoped":
            self._push_scoped()

    def _exclude(self, t: Any) -> None:
        if t is not None:
            for key, _n in self._storages(t, note=False):
                self.exclude.add(key)

    # --- the saved-tensor hooks ---------------------------------------------------------------

    def _start_saved(self) -> None:
        top_fn = _top_hooks_fn(self.torch)
        if top_fn is not None and _call_top(top_fn) is None:
            # Nothing of the trainer's is active: ours stay until the optimizer hook, so the loss
            # computed outside the model counts too.
            self._push(None)
            self.mode = "span"
        else:
            # The trainer's own hooks are active (ours chain to them), or an older torch cannot
            # show the stack: ours live within each outermost module's call, where nesting is sure.
            self.mode = "scoped"
            self._push_scoped()

    def _push_scoped(self) -> None:
        top_fn = _top_hooks_fn(self.torch)
        if top_fn is not None:
            inner = _call_top(top_fn)
        elif self._hooks_active():
            self.partial[PARTIAL_ACTIVATIONS] = (
                "%s: the trainer's own saved_tensors_hooks were active and torch %s cannot chain to them "
                "(torch >= 2.8 can); activations saved under them are not counted"
                % (PARTIAL_ACTIVATIONS, self.torch.__version__)
            )
            return
        else:
            inner = None
        self._push(inner)
        self._scoped += 1

    def _pop_scoped(self) -> None:
        self._scoped -= 1
        self._pop_ours()

    def _push(self, inner: Any) -> None:
        pack, unpack = self._hooks(inner)
        self.counting = True
        self.torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
        self._packs.append(pack)

    def _hooks(self, inner: Any) -> Tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        inner_pack, inner_unpack = inner if inner is not None else (None, None)
        count = self._count_saved

        def pack(t: Any) -> Any:
            obj = inner_pack(t) if inner_pack is not None else t.detach()
            held = _Held(obj)
            if self.counting:
                try:
                    count(t if inner_pack is None else obj, held)
                except Exception as exc:
                    self._fail(exc)
            elif self._probing:
                self._probe_hit = True
            return held

        def unpack(held: Any) -> Any:
            obj = held.obj if isinstance(held, _Held) else held
            return inner_unpack(obj) if inner_unpack is not None else obj

        pack._gpumon = True  # type: ignore[attr-defined]
        return pack, unpack

    def _is_top(self, pack: Any) -> bool:
        """Whether `pack` (one of ours) is the top of the saved-tensor hooks stack."""
        top_fn = _top_hooks_fn(self.torch)
        if top_fn is not None:
            top = _call_top(top_fn)
            return top is not None and top[0] is pack
        # Older torch: save one tensor and see whether our pack hook is what packs it.
        torch = self.torch
        counting, self.counting = self.counting, False
        self._probe_hit = False
        self._probing = True
        try:
            with torch.enable_grad():
                torch.zeros((), requires_grad=True).exp()
        finally:
            self._probing = False
            self.counting = counting
        return self._probe_hit and self._packs[-1] is pack

    def _pop_ours(self) -> bool:
        """Pops our latest pair off the saved-tensor hooks stack; True when it is gone.

        When the trainer pushed its own on top and keeps them past this point (a context entered
        after the model ran and left after optimizer.step()), newer torch lets us take ours out
        from under theirs: theirs are popped, ours, and theirs pushed back as they were. An older
        torch cannot read the stack: ours stay, hand tensors on, and go when on top (`unstale`)."""
        if not self._packs:
            return True
        pack = self._packs[-1]
        autograd = self.torch._C._autograd
        top_fn = _top_hooks_fn(self.torch)
        if top_fn is None:
            if self._is_top(pack):
                autograd._pop_saved_tensors_default_hooks()
                self._packs.pop()
                return True
            self.stale = True
            return False
        above: List[Any] = []
        found = False
        try:
            for _ in range(_MAX_ABOVE):
                top = _call_top(top_fn)
                if top is None:
                    break
                if top[0] is pack:
                    autograd._pop_saved_tensors_default_hooks()
                    found = True
                    break
                above.append(top)
                autograd._pop_saved_tensors_default_hooks()
        finally:
            for top_pack, top_unpack in reversed(above):
                autograd._push_saved_tensors_default_hooks(top_pack, top_unpack)
        if found:
            self._packs.pop()
            return True
        self.stale = True
        return False

    def _hooks_active(self) -> bool:
        """Older torch: whether some saved_tensors_hooks are active now (a saved tensor that
        already has hooks refuses more)."""
        torch = self.torch
        with torch.enable_grad():
            y = torch.zeros((), requires_grad=True).exp()
            try:
                y.grad_fn._raw_saved_result.register_hooks(lambda t: t.detach(), lambda t: t)
            except RuntimeError:
                return True
        return False

    def _end_saved(self) -> None:
        """Pops every pair of ours still pushed (the span's; a scoped one a raising forward left)."""
        self.counting = False
        self._scoped = 0
        if self.mode == "span":
            self.mode = "done"
        while self._packs:
            if not self._pop_ours():
                break

    def unstale(self) -> bool:
        """Pops our hooks left under the trainer's once they can be; True when none is left.
        Until then our pack hook only hands tensors on (counting nothing)."""
        try:
            while self._packs:
                if not self._pop_ours():
                    return False
            self.stale = False
            return True
        except Exception as exc:
            log.debug("gpumon: memory split hooks not removed: %r", exc)
            return False

    def _count_saved(self, saved: Any, held: _Held) -> None:
        """Counts what autograd keeps for one saved tensor: the tensor, or, under the trainer's own
        hooks, the tensors their pack returned (save_on_cpu: a CPU copy, not on the device)."""
        tensor = self._tensor_types[0]
        if isinstance(saved, tensor):
            tensors: Sequence[Any] = (saved,)
        elif isinstance(saved, (tuple, list)):
            tensors = [x for x in saved if isinstance(x, tensor)]
        else:
            return  # a handle only the trainer's hooks understand: where its tensor lives is unknown
        parameter = self._parameter
        keys = None
        exclude, live = self.exclude, self.live
        for t in tensors:
            if isinstance(t, parameter) or isinstance(t._base, parameter):
                continue
            for key, n in self._storages(t):
                if key in exclude:
                    continue
                refs = live.get(key)
                if refs is None:
                    live[key] = 1
                    self.live_bytes += n
                    if self.live_bytes > self.peak:
                        self.peak = self.live_bytes
                else:
                    live[key] = refs + 1
                if keys is None:
                    keys = [(key, n)]
                else:
                    keys.append((key, n))
        if keys is not None:
            held.keys = keys
            held.owner = self

    def _release(self, keys: List[Tuple[Key, int]]) -> None:
        live = self.live
        for key, n in keys:
            refs = live.get(key)
            if refs is None:
                continue
            if refs <= 1:
                del live[key]
                self.live_bytes -= n
            else:
                live[key] = refs - 1

    # --- storages ------------------------------------------------------------------------------

    def _storages(self, t: Any, note: bool = True) -> Iterator[Tuple[Key, int]]:
        """The storages of `t` on the device: (key, bytes). A wrapper subclass (DTensor, other
        traceable subclasses) yields its inner tensors' storages: what this rank holds."""
        if not isinstance(t, self._tensor_types[0]):
            return
        flatten = getattr(type(t), "__tensor_flatten__", None)
        if flatten is not None:
            if note and type(t).__name__ == "DTensor" and PARTIAL_DTENSOR not in self.partial:
                self.partial[PARTIAL_DTENSOR] = (
                    "%s: DTensor parameters, gradients or state (FSDP2, tensor parallel) are counted at "
                    "their local shard's size (to_local()), what this rank holds, not their global size" % PARTIAL_DTENSOR
                )
            names, _ctx = flatten(t)
            for name in names:
                yield from self._storages(getattr(t, name, None), note)
            return
        device = t.device
        if device != self.device and not (self._any_index and device.type == self.device.type):
            return
        try:
            storage = t.untyped_storage()
        except Exception:
            return  # no storage (meta, sparse, a subclass without one)
        n = storage.nbytes()
        if n:
            yield (storage.data_ptr(), n), n

    # --- reading the split --------------------------------------------------------------------

    def finish(self, step: int, optimizers: Sequence[Any]) -> Optional[Categories]:
        """At the measured step's optimizer hook: the split (None when it failed or found nothing;
        `error` says why), every hook removed."""
        try:
            self._remove_module_hooks()
            self._end_saved()
            if self.off is not None or self.error is not None:
                return None
            if not self.roots and not self.modules:
                self.error = "no module ran in the step"
                return None
            return self._read(step, optimizers)
        except Exception as exc:
            self._fail(exc)
            return None
        finally:
            self.counting = False
            self._drop_refs()

    def _read(self, step: int, optimizers: Sequence[Any]) -> Optional[Categories]:
        modules: Dict[int, Any] = {}
        for root in self.roots:
            for sub in root.modules():
                modules[id(sub)] = sub
        modules.update(self.modules)
        params: Dict[int, Any] = {}
        buffers: Dict[int, Any] = {}
        flat = 0  # FSDP1 units whose flat parameter holds a shard (sharded already, say so)
        for mod in modules.values():
            for p in getattr(mod, "_parameters", {}).values():
                if p is not None:
                    params[id(p)] = p
            for b in getattr(mod, "_buffers", {}).values():
                if b is not None:
                    buffers[id(b)] = b
            if type(mod).__name__ == "FullyShardedDataParallel" and _sharded_flat(getattr(mod, "_flat_param", None)):
                flat += 1
        counted: Set[Key] = set()

        def add(t: Any) -> int:
            total = 0
            for key, n in self._storages(t):
                if key not in counted:
                    counted.add(key)
                    total += n
            return total

        # fp32: of the parameters and gradients, the bytes stored in float32 (what bf16 would
        # halve), each storage counted with the tensor that counted it first.
        parameters = gradients = state = buffers_bytes = fp32 = 0
        empty = zero3 = trainable = with_grad = main_grads = 0
        float32 = self._float32
        for p in params.values():
            n = add(p)
            parameters += n
            if p.dtype == float32:
                fp32 += n
            if p.numel() == 0:
                empty += 1
                ds = getattr(p, "ds_tensor", None)
                if ds is not None:
                    zero3 += 1
                    n = add(ds)
                    parameters += n
                    if getattr(ds, "dtype", None) == float32:
                        fp32 += n
        for p in params.values():
            g = p.grad
            if g is not None:
                with_grad += 1
                n = add(g)
                gradients += n
                if g.dtype == float32:
                    fp32 += n
            main = getattr(p, "main_grad", None)
            if main is not None and isinstance(main, self._tensor_types[0]):
                main_grads += 1
                n = add(main)
                gradients += n
                if main.dtype == float32:
                    fp32 += n
            if p.requires_grad:
                trainable += 1
        for opt in optimizers:
            for per_param in list(getattr(opt, "state", {}).values()):
                values = per_param.values() if isinstance(per_param, dict) else (per_param,)
                for v in values:
                    if isinstance(v, (list, tuple)):
                        for item in v:
                            state += add(item)
                    else:
                        state += add(v)
        for b in buffers.values():
            buffers_bytes += add(b)
        partial = self.partial
        if zero3:
            partial[PARTIAL_ZERO3] = (
                "%s: %d parameters are DeepSpeed ZeRO-3 partitions: each counted at its partition (ds_tensor), "
                "what this rank holds; the gathered parameters of a layer are temporaries" % (PARTIAL_ZERO3, zero3)
            )
        elif empty:
            partial[PARTIAL_SHARDED] = (
                "%s: %d parameters have size 0 here (sharded: ZeRO-3, FSDP1): only what this rank holds "
                "(a flat parameter) is counted" % (PARTIAL_SHARDED, empty)
            )
        elif flat:
            # FSDP1 without use_orig_params (or a rank whose shard holds no whole parameter of
            # size 0): no parameter is empty, yet each flat parameter, its gradient and its state
            # are this rank's shard. The code tells the daemon the state is sharded already, so it
            # sizes no sharding remedy.
            partial[PARTIAL_SHARDED] = (
                "%s: %d FSDP units hold this rank's shard of their flat parameter (FSDP1): parameters, "
                "gradients and optimizer state are counted at that size, not the model's" % (PARTIAL_SHARDED, flat)
            )
        if main_grads:
            partial[PARTIAL_MAIN_GRAD] = (
                "%s: %d parameters keep their gradient in main_grad (Megatron): counted from it, the whole "
                "gradient buffer once" % (PARTIAL_MAIN_GRAD, main_grads)
            )
        elif trainable and not with_grad:
            partial[PARTIAL_GRADS_ELSEWHERE] = (
                "%s: %d parameters require grad but none has a .grad at the optimizer step (DeepSpeed ZeRO-1/2 "
                "keeps them in its own buffers): gradients not counted" % (PARTIAL_GRADS_ELSEWHERE, trainable)
            )
        if not self._grad_root:
            partial[PARTIAL_NO_GRAD_ROOT] = (
                "%s: no module ran with grad enabled in the step: no activations were seen" % PARTIAL_NO_GRAD_ROOT
            )
        if not counted and not self.peak:
            self.error = "no tensor on %s" % (self.device,)
            return None
        return protocol.categories(
            step,
            parameters_bytes=parameters,
            gradients_bytes=gradients,
            optimizer_state_bytes=state,
            buffers_bytes=buffers_bytes,
            activations_bytes=self.peak,
            batch_size=self.batch_size,
            fp32_bytes=fp32,
            partial=list(partial.values()) or None,
        )


def _sharded_flat(p: Any) -> bool:
    """Whether `p`, an FSDP1 unit's flat parameter (or None), holds a shard: fewer elements here
    than the parameters it flattens (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD; not NO_SHARD)."""
    unsharded = getattr(p, "_unpadded_unsharded_size", None)
    try:
        return unsharded is not None and int(p.numel()) < int(unsharded.numel())
    except Exception:
        return False


def _call_top(top_fn: Any) -> Any:
    """The top of the saved-tensor hooks stack (pack, unpack), or None. Newer torch takes
    `ignore_is_tracing`; an older variant took nothing."""
    try:
        return top_fn(False)
    except TypeError:
        return top_fn()


def _batch_of(types: Tuple[Any, ...], args: Any) -> Optional[int]:
    """The first dimension of the first tensor in `args` (a tuple, or kwargs), looking one level
    into lists, tuples and dicts; None when there is none."""
    values = args.values() if isinstance(args, dict) else args
    for value in values:
        if isinstance(value, types[0]):
            return int(value.shape[0]) if value.dim() >= 1 else None
        if isinstance(value, (list, tuple)):
            inner = value
        elif isinstance(value, dict):
            inner = tuple(value.values())
        else:
            continue
        for item in inner:
            if isinstance(item, types[0]):
                return int(item.shape[0]) if item.dim() >= 1 else None
    return None
