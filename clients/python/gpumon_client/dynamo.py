"""Keeps optimizer step hooks alive through torch.compile on torch versions whose dynamo strips them.

On torch 2.1 each torch.compile() call runs `torch._dynamo.eval_frame.TorchPatcher.patch()` (once per
process, cached), which
unwraps `step` of every torch.optim class (removing the wrapper that calls the global step hooks)
and marks it hooked so torch never wraps it again: attach() would go silent from the first
torch.compile() on. Where that patcher exists, the client re-applies torch's own wrapper after it
runs, and at attach() if it already ran. Later torch versions keep the hooks; nothing is done there.
"""

import logging
import sys
from typing import Any

log = logging.getLogger("gpumon_client")


def keep_step_hooks(torch: Any) -> None:
    """Never raises; a torch this does not recognise is left alone."""
    try:
        eval_frame = sys.modules.get("torch._dynamo.eval_frame")
        patcher = getattr(eval_frame, "TorchPatcher", None)
        patch = getattr(patcher, "patch", None)
        code = getattr(getattr(patch, "__wrapped__", patch), "__code__", None)
        if patcher is None or patch is None or code is None or "hooked" not in code.co_names:
            return
        _rehook(torch)  # torch.compile() runs the patcher when called: maybe before attach()
        if getattr(patch, "_gpumon_wrapped", False):
            return

        def patch_then_rehook() -> Any:
            out = patch()
            _rehook(torch)
            return out

        patch_then_rehook._gpumon_wrapped = True  # type: ignore[attr-defined]
        patcher.patch = staticmethod(patch_then_rehook)
    except Exception as exc:
        log.debug("gpumon: could not guard step hooks against dynamo: %r", exc)


def _rehook(torch: Any) -> None:
    optimizer = torch.optim.Optimizer
    wrap = getattr(optimizer, "profile_hook_step", None)
    if wrap is None:
        return
    # torch's wrapper is told apart by its code object (functools.wraps copies names, not code).
    wrapper_code = wrap(lambda *a, **k: None).__code__
    for cls in list(vars(torch.optim).values()):
        if not (isinstance(cls, type) and issubclass(cls, optimizer)):
            continue
        step = vars(cls).get("step")
        # Stripped: marked hooked, yet no longer torch's wrapper.
        if step is None or not getattr(step, "hooked", False) or getattr(step, "__code__", None) is wrapper_code:
            continue
        wrapped = wrap(step)
        wrapped.hooked = True
        setattr(cls, "step", wrapped)  # any optimizer class: `type` names no `step` to assign
